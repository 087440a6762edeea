"""`python3 limited.py MIB (PATH | -m MODULE) [ARGS...]`: runs a Python program as `python3 PATH
ARGS` would, under an address-space limit of MIB MiB (RLIMIT_AS and RLIMIT_DATA, what
SandboxFusion's `memory_limit_MB` sets). Runs inside the sandbox; being a Python command, it is
served by the episode container's warm interpreter, so a limit costs no fresh `python3`.
An allocation past the limit fails inside the program (MemoryError).
"""

import os
import resource
import runpy
import sys
import traceback


def _limit(mib):
    for res in (resource.RLIMIT_AS, resource.RLIMIT_DATA):
        _soft, hard = resource.getrlimit(res)
        want = mib << 20
        if hard != resource.RLIM_INFINITY:
            want = min(want, hard)  # never above what the container allows
        resource.setrlimit(res, (want, want))


def main():
    _limit(int(sys.argv[1]))
    args = sys.argv[2:]
    try:
        if args[0] == "-m":
            sys.argv = [args[1], *args[2:]]
            sys.path[0] = os.getcwd()
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = args
            sys.path[0] = os.path.dirname(os.path.realpath(args[0]))
            runpy.run_path(args[0], run_name="__main__")
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 - as the interpreter does: traceback, status 1
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__, "<frozen runpy>"):
            tb = tb.tb_next  # this wrapper's frames and runpy's are not the program's
        traceback.print_exception(type(e), e, tb)
        sys.exit(1)


if __name__ == "__main__":
    main()
