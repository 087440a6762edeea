"""The languages `/run_code` runs: how each is compiled and run, and which ones an image has.

Commands follow SandboxFusion's runners (sandbox/runners/major.py): the code is written to one
file in the working directory, compiled when the language is compiled (`compile_timeout`),
then run (`run_timeout`, `stdin`); a compile that fails or times out means no run. The
programs are named as SandboxFusion names them (`test` for C++ and Rust, `out` for Go, class
`Main` on a classpath of `.` plus the request's `.jar` files for Java); the source file is
`main.<ext>` where SandboxFusion picks a random name. A language is offered only when the image has its
toolchain (probed once at start-up) and its hello-world ran through the episode pool.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field

# Inside the sandbox: every request's working directory (relative `files` and `fetch_files`
# paths are resolved there) and the helper programs copied into the warm snapshot.
WORKDIR = "/work"
SCRIPTS_DIR = "/opt/rollbox-fusion"
LIMITED = f"{SCRIPTS_DIR}/limited.py"
KERNEL = f"{SCRIPTS_DIR}/kernel.py"
# Go's build cache lives in the snapshot, warmed at start-up: a request compiles only its own code.
TOOL_ENV = {"GOCACHE": "/var/cache/rollbox-fusion/go-build", "GOPATH": "/tmp/go", "GOFLAGS": "-buildvcs=false"}
# Every task (thread) of a pooled sandbox counts against each of its containers' process
# limit (gVisor's RLIMIT_NPROC is per sandbox): `go build` beside a javac in the neighbour
# container failed to start threads (1 in 12 go builds, 12 java + 12 go at concurrency 8), so
# the compilers run with fewer threads: the go tool on one P (it peaked at 17 tasks, 14 so),
# javac on the serial GC and C1 alone.
GO_COMPILE_ENV = {**TOOL_ENV, "GOMAXPROCS": "1"}
_JAVAC_LEAN = ("-J-XX:+UseSerialGC", "-J-XX:TieredStopAtLevel=1", "-J-XX:CICompilerCount=1")
# What a compiler prints when it could not start a thread or process (EAGAIN): the sandbox's
# task limit was full for a moment, not the code's fault; such a compile is tried again.
TRANSIENT_COMPILE_FAILURES = ("pthread_create failed: Resource temporarily unavailable",
                              "unable to create native thread", "Resource temporarily unavailable (os error 11)",
                              ": resource temporarily unavailable", "Cannot create worker GC thread")

# Every language name SandboxFusion's API accepts (its `Language` literal); the ones not in
# LANGUAGES are answered as "not supported by this server", anything else as unknown.
SANDBOX_FUSION_LANGUAGES = (
    "python", "python2", "cpp", "nodejs", "go", "go_test", "java", "php", "csharp", "bash", "typescript", "sql",
    "rust", "cuda", "lua", "R", "perl", "D_ut", "ruby", "scala", "julia", "pytest", "junit", "kotlin_script",
    "jest", "verilog", "python_gpu", "lean", "swift", "racket", "gtest", "react")


@dataclass(frozen=True)
class Language:
    """One language: the file its code goes to, its compile and run commands (argv, in
    WORKDIR), the programs it needs on PATH (and a Python module, for pytest), and a
    hello-world whose output must contain `hello_prints`."""

    name: str
    source: str
    run: tuple[str, ...]
    compile: tuple[str, ...] | None = None
    needs: tuple[str, ...] = ()
    module: str | None = None
    hello: str = ""
    hello_prints: str = "hello"
    env: dict[str, str] = field(default_factory=dict)
    compile_env: dict[str, str] | None = None  # the compiler's environment, when not `env`
    classpath: bool = False  # Java: `-cp .:JARS` on both commands, JARS the request's `.jar` files

    def _with_classpath(self, argv: tuple[str, ...], files: Iterable[str]) -> list[str]:
        if not self.classpath:
            return list(argv)
        jars = [".", *sorted(f for f in files if f.endswith(".jar"))]
        return [argv[0], "-cp", ":".join(jars), *argv[1:]]

    def compiler_env(self) -> dict[str, str]:
        """The environment the compile command runs with."""
        return self.env if self.compile_env is None else self.compile_env

    def compile_argv(self, files: Iterable[str] = ()) -> list[str] | None:
        """The compile command (None for an interpreted language); `files`: the request's
        file names (a Java classpath lists its `.jar` files)."""
        return None if self.compile is None else self._with_classpath(self.compile, files)

    def run_argv(self, memory_limit_mib: int, files: Iterable[str] = ()) -> list[str]:
        """The run command, under an address-space limit when `memory_limit_mib` > 0;
        `files` as for compile_argv."""
        run = self._with_classpath(self.run, files)
        if memory_limit_mib <= 0:
            return run
        if run[0] == "python3":  # through the warm interpreter: no fresh python3
            return ["python3", LIMITED, str(memory_limit_mib), *run[1:]]
        kib = str(memory_limit_mib << 10)
        # RLIMIT_AS and RLIMIT_DATA, as SandboxFusion sets them; not its stack limit of the same
        # size: under gVisor exec then fails (bash under 64 MiB of both: ENOMEM; 200 MiB AS: runs).
        return ["sh", "-c", 'ulimit -v "$1" && ulimit -d "$1" && shift && exec "$@"', "sh", kib, *run]


# A JVM reserves 1 GiB of address space for class metadata by default: under a container's
# address-space limit (the sandbox's memory) javac and java then fail to start.
_JVM_CLASS_SPACE = "-XX:CompressedClassSpaceSize=64m"
_C_HELLO = '#include <cstdio>\nint main() { std::puts("hello"); return 0; }\n'
LANGUAGES: dict[str, Language] = {lang.name: lang for lang in (
    Language("python", "main.py", ("python3", "main.py"), needs=("python3",), hello='print("hello")\n'),
    Language("pytest", "test_main.py", ("python3", "-m", "pytest", "test_main.py"), needs=("python3",),
             module="pytest", hello="def test_hello():\n    assert 'hello'\n", hello_prints="1 passed"),
    Language("bash", "main.sh", ("bash", "main.sh"), needs=("bash",), hello="echo hello\n"),
    # SandboxFusion adds -lcrypto -lssl where they link; the toolchains image has no libssl-dev.
    Language("cpp", "main.cpp", ("./test",), compile=("g++", "-std=c++17", "main.cpp", "-o", "test", "-lpthread"),
             needs=("g++",), hello=_C_HELLO),
    Language("go", "main.go", ("./out",), compile=("go", "build", "-o", "out", "main.go"), needs=("go",),
             hello='package main\n\nimport "fmt"\n\nfunc main() { fmt.Println("hello") }\n', env=TOOL_ENV,
             compile_env=GO_COMPILE_ENV),
    Language("java", "Main.java", ("java", "-ea", _JVM_CLASS_SPACE, "Main"),
             compile=("javac", "-J" + _JVM_CLASS_SPACE, *_JAVAC_LEAN, "Main.java"), needs=("javac", "java"),
             classpath=True,
             hello='public class Main { public static void main(String[] a) { System.out.println("hello"); } }\n'),
    Language("nodejs", "main.js", ("node", "main.js"), needs=("node",), hello='console.log("hello");\n'),
    Language("rust", "main.rs", ("./test",), compile=("rustc", "main.rs", "-o", "test"), needs=("rustc",),
             hello='fn main() { println!("hello"); }\n'),
)}


def transient_compile_failure(exit_code: int | None, output: bytes) -> bool:
    """Whether a failed compile failed to start a thread or process (see TRANSIENT_COMPILE_FAILURES)."""
    text = output.decode("utf-8", "replace")
    return exit_code not in (0, None) and any(marker in text for marker in TRANSIENT_COMPILE_FAILURES)


def probe_command() -> list[str]:
    """A command printing `NAME` for each program of LANGUAGES on the image's PATH, and
    `module:NAME` for each Python module that imports."""
    programs = sorted({p for lang in LANGUAGES.values() for p in lang.needs})
    modules = sorted({lang.module for lang in LANGUAGES.values() if lang.module})
    script = " ".join(f"command -v {shlex.quote(p)} >/dev/null 2>&1 && echo {shlex.quote(p)};" for p in programs)
    for m in modules:
        check = shlex.quote(f"import {m}")
        script += f" python3 -c {check} >/dev/null 2>&1 && echo module:{m};"
    return ["sh", "-c", script + " true"]


def installed(probe_output: str) -> dict[str, str]:
    """{language: ""} for each language whose toolchain the probe found, and {language: why
    not} for the others."""
    found = set(probe_output.split())
    out: dict[str, str] = {}
    for name, lang in LANGUAGES.items():
        missing = [p for p in lang.needs if p not in found]
        if lang.module and f"module:{lang.module}" not in found:
            missing.append(f"{lang.module} (a Python module)")
        out[name] = "" if not missing else "the image has no " + " or ".join(missing)
    return out


def unavailable_message(language: object, available: list[str], why_not: dict[str, str]) -> str:
    """SandboxFusion's message for a language this server cannot run."""
    offer = f"this server runs: {', '.join(available) or 'nothing'}"
    if not isinstance(language, str) or language not in SANDBOX_FUSION_LANGUAGES:
        return f"unknown language {language!r}; {offer}"
    if language not in LANGUAGES:
        return f"language {language!r} is not supported by rollbox serve-fusion; {offer}"
    return (f"language {language!r} is not available in this server's image ({why_not.get(language) or 'unknown'}); "
            f"start `rollbox serve-fusion --image toolchains` (or an image with its toolchain); {offer}")
