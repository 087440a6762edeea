"""SandboxFusion's wire format: the request and response bodies of `/run_code` and
`/run_jupyter`, field for field (bytedance/SandboxFusion sandbox/server/sandbox_api.py and
sandbox/runners/types.py; the PyPI client `sandbox-fusion` parses these).

Differences, each deliberate: `language` is any string here, so that an unknown one gets
SandboxFusion's error shape (`status: SandboxError` and a message) instead of a validation
error; timeouts must be positive seconds (at most a day).
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Dict, List, Optional

from pydantic import BaseModel, ConfigDict, Field

MAX_TIMEOUT_S = 86400.0


class CommandRunStatus(str, Enum):
    """How one command (a compile or a run) ended."""

    Finished = "Finished"  # it exited; `return_code` says how
    Error = "Error"  # it was killed for a resource (out of memory, process limit) or could not run
    TimeLimitExceeded = "TimeLimitExceeded"  # killed at its timeout; `return_code` is None, as in SandboxFusion


class RunStatus(str, Enum):
    """The request's outcome."""

    Success = "Success"  # every command finished with return code 0
    Failed = "Failed"  # a command failed, timed out or was killed: the program's fault
    SandboxError = "SandboxError"  # the request could not be served (bad input, platform fault)


class CommandRunResult(BaseModel):
    status: CommandRunStatus
    execution_time: Optional[float] = None  # seconds, measured inside the sandbox
    return_code: Optional[int] = None  # 128+N when killed by signal N
    stdout: Optional[str] = None
    stderr: Optional[str] = None


class RunCodeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    compile_timeout: float = Field(10, gt=0, le=MAX_TIMEOUT_S, description="compile timeout in seconds")
    run_timeout: float = Field(10, gt=0, le=MAX_TIMEOUT_S, description="run timeout in seconds")
    memory_limit_MB: int = Field(-1, description="address-space limit of the program in MiB; <= 0: none")
    code: str = Field(..., examples=['print("hello")'], description="the code to run")
    stdin: Optional[str] = Field(None, description="text passed to the program's stdin")
    language: str = Field(..., examples=["python"], description="the language or execution mode")
    files: Dict[str, Optional[str]] = Field({}, description="path (relative to the working directory) -> "
                                                         "base64 content, written before the run")
    fetch_files: List[str] = Field([], description="paths to return, base64, after the run")


class RunCodeResponse(BaseModel):
    status: RunStatus
    message: str = ""
    compile_result: Optional[CommandRunResult] = None
    run_result: Optional[CommandRunResult] = None
    executor_pod_name: Optional[str] = None  # the rollbox sandbox that ran it
    files: Dict[str, str] = {}


class RunJupyterRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    cells: List[str] = Field(..., description="code cells, run in order in one interpreter")
    cell_timeout: float = Field(0, ge=0, le=MAX_TIMEOUT_S, description="seconds per cell; 0: no limit")
    total_timeout: float = Field(45, gt=0, le=MAX_TIMEOUT_S, description="seconds for all the cells")
    memory_limit_MB: int = Field(-1, description="address-space limit of the kernel in MiB; <= 0: none")
    kernel: str = "python3"
    files: Dict[str, Optional[str]] = Field({}, description="path -> base64 content, written before the run")
    fetch_files: List[str] = Field([], description="paths to return, base64, after the run")


class CellRunResult(BaseModel):
    stdout: str
    stderr: str
    display: List[Dict[str, Any]]
    error: List[Dict[str, Any]]


class RunJupyterResponse(BaseModel):
    status: RunStatus
    message: str = ""
    driver: Optional[CommandRunResult] = None
    cells: List[CellRunResult] = []
    executor_pod_name: Optional[str] = None
    files: Dict[str, str] = {}
