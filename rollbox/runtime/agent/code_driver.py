"""run_code's persistent Python interpreter (gh-16), shipped beside the agent at /.rollbox.

The daemon starts it once per sandbox as a background process (`proc_start`) and keeps it for
the sandbox's life, so state (variables, imports) carries from one snippet to the next, as
E2B's code interpreter does. Protocol, one request per line on stdin:

    {"id": "...", "code": "..."}\\n

and one reply line per request on stdout, prefixed so that output a snippet's subprocesses
write straight to fd 1 cannot be taken for it:

    \\x1eROLLBOX-RESULT {"id", "stdout", "stderr", "value", "error": {name, value, traceback} | null}\\n

A snippet's own print()s and tracebacks are captured (sys.stdout/sys.stderr) into the reply.
The value is repr() of the last statement when it is an expression (None when that is None).
Standard library only: it runs under the image's python3.
"""

import ast
import io
import json
import sys
import traceback

PREFIX = "\x1eROLLBOX-RESULT "


def run(code, ns):
    """Runs `code` in namespace `ns`; returns the reply fields (without the id)."""
    out, err = io.StringIO(), io.StringIO()
    value = None
    error = None
    real = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        tree = ast.parse(code, "<cell>", "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, "<cell>", "exec"), ns)  # noqa: S102 - running the user's code is the point
        if last is not None:
            v = eval(compile(last, "<cell>", "eval"), ns)  # noqa: S307
            if v is not None:
                ns["_"] = v
                value = repr(v)
    except BaseException as e:  # noqa: BLE001 - SystemExit and KeyboardInterrupt are results too
        tb = traceback.format_exception(type(e), e, e.__traceback__)
        # Drop this driver's own frames: the traceback starts at the cell.
        tb = [line for line in tb if __file__ not in line]
        error = {"name": type(e).__name__, "value": str(e), "traceback": "".join(tb)}
    finally:
        sys.stdout, sys.stderr = real
    return {"stdout": out.getvalue(), "stderr": err.getvalue(), "value": value, "error": error}


def main():
    ns = {"__name__": "__main__", "__builtins__": __builtins__}
    out = sys.stdout
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
            reply = run(str(req["code"]), ns)
            reply["id"] = req.get("id")
        except (ValueError, KeyError, TypeError) as e:
            reply = {"id": None, "stdout": "", "stderr": "", "value": None,
                     "error": {"name": "ProtocolError", "value": str(e), "traceback": ""}}
        out.write(PREFIX + json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
