"""The POSIX `sh` programs the inspect provider runs inside a sandbox, and how their exit
statuses read back. Pure: no inspect_ai and no daemon here, so unit tests run them on the host.

Every program is started as `/bin/sh -c PROGRAM NAME ARGS...` (argv, never a string the
shell re-parses), so paths and user names travel as positional parameters and need no
quoting. The file programs pin their own `PATH` (they run nothing the caller chose); the
user wrapper resolves nothing through `PATH` before it hands over to the caller's command,
which `setpriv` then finds through the caller's own `PATH`, as inspect's providers must.
"""

from __future__ import annotations

import enum

SH = "/bin/sh"
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


class FileStatus(enum.IntEnum):
    """Exit statuses of the file programs (chosen above what `head`, `cat`, `mkdir` return)."""

    OK = 0
    IS_A_DIRECTORY = 121
    NOT_FOUND = 122
    PERMISSION_DENIED = 123
    TOO_LARGE = 124
    NOT_A_DIRECTORY = 125


# Exit status and stderr prefix of the user wrapper when the sandbox cannot run as the user.
USER_UNSUPPORTED_STATUS = 125
USER_UNSUPPORTED_MARK = "rollbox-inspect: cannot run as user"
# Docker's own text (and exit status) for `docker exec --user NAME` of an unknown user.
UNKNOWN_USER_STATUS = 126

# read_file: $1 path, $2 the byte limit, $3 bytes of the first chunk. Prints "SIZE\n" on stderr,
# then the first chunk of the file on stdout. A file its owner cannot read is unreadable even
# to root (what inspect's Docker provider reports), as is one the caller's user cannot read.
READ_FILE = f"""PATH={SYSTEM_PATH}
set -f
f=$1
if [ -d "$f" ]; then exit {FileStatus.IS_A_DIRECTORY:d}; fi
if [ ! -e "$f" ]; then exit {FileStatus.NOT_FOUND:d}; fi
if [ ! -r "$f" ]; then exit {FileStatus.PERMISSION_DENIED:d}; fi
set -- $(ls -lLdn -- "$f") || exit 1
case $1 in ?r*) ;; *) exit {FileStatus.PERMISSION_DENIED:d};; esac
size=$5
shift $#
printf '%s\\n' "$size" >&2
if [ "$size" -gt "${{LIMIT}}" ]; then exit {FileStatus.TOO_LARGE:d}; fi
exec head -c "${{CHUNK}}" -- "$f"
"""

# read_chunk: $1 path, $2 offset in bytes, $3 length in bytes.
READ_CHUNK = f"""PATH={SYSTEM_PATH}
tail -c +$(($2 + 1)) -- "$1" | head -c "$3"
"""

# write_file: $1 path; the contents come on stdin. Parent directories are made first.
WRITE_FILE = f"""PATH={SYSTEM_PATH}
f=$1
if [ -d "$f" ]; then exit {FileStatus.IS_A_DIRECTORY:d}; fi
case $f in */*) d=${{f%/*}}; d=${{d:-/}};; *) d=.;; esac
if [ ! -d "$d" ]; then
  if [ -e "$d" ]; then exit {FileStatus.NOT_A_DIRECTORY:d}; fi
  mkdir -p -- "$d" || exit {FileStatus.PERMISSION_DENIED:d}
fi
if [ -e "$f" ]; then
  [ -w "$f" ] || exit {FileStatus.PERMISSION_DENIED:d}
else
  [ -w "$d" ] || exit {FileStatus.PERMISSION_DENIED:d}
fi
exec cat > "$f"
"""

# Runs "$@" as user $1 (a name or a numeric uid) with its passwd entry's uid, gid and groups;
# $2 is "1" to set HOME, USER and LOGNAME from that entry (the caller gave none of its own).
# Everything before the hand-over is a shell builtin or an absolute path.
AS_USER = f"""u=$1; sethome=$2; shift 2
n=; id=; gid=; home=
while IFS=: read -r pn _ pid pgid _ phome _; do
  if [ "$pn" = "$u" ] || [ "$pid" = "$u" ]; then n=$pn; id=$pid; gid=$pgid; home=$phome; break; fi
done < /etc/passwd
if [ -z "$id" ]; then
  case $u in
    ''|*[!0-9]*) printf 'unable to find user %s: no matching entries in passwd file\\n' "$u" >&2
                 exit {UNKNOWN_USER_STATUS:d};;
  esac
  id=$u; gid=0; home=/
fi
if [ "$sethome" = 1 ]; then
  HOME=$home; export HOME
  if [ -n "$n" ]; then USER=$n; LOGNAME=$n; export USER LOGNAME; fi
fi
if [ -x /usr/bin/setpriv ]; then s=/usr/bin/setpriv
elif [ -x /bin/setpriv ]; then s=/bin/setpriv
else
  printf '%s %s: the image has no setpriv (util-linux)\\n' '{USER_UNSUPPORTED_MARK}' "$u" >&2
  exit {USER_UNSUPPORTED_STATUS:d}
fi
if [ -n "$n" ]; then exec "$s" --reuid="$id" --regid="$gid" --init-groups -- "$@"; fi
exec "$s" --reuid="$id" --regid="$gid" --clear-groups -- "$@"
"""

# Who the sandbox's commands run as, and where: "UID\\nHOME\\nPWD\\nNAME\\n".
IDENTITY = 'printf "%s\\n%s\\n%s\\n%s\\n" "$(id -u)" "$HOME" "$(pwd)" "$(id -un 2>/dev/null)"'

# Makes the sample's working directory $1, owned by user $2 when given.
MAKE_WORKDIR = f"""PATH={SYSTEM_PATH}
mkdir -p -- "$1" && if [ -n "$2" ]; then chown -- "$2" "$1"; fi
"""


def read_file_argv(path: str, limit: int, chunk: int) -> list[str]:
    """argv reading the first `chunk` bytes of `path` (limit and chunk in bytes)."""
    program = READ_FILE.replace("${LIMIT}", str(int(limit))).replace("${CHUNK}", str(int(chunk)))
    return [SH, "-c", program, "rollbox-read", path]


def read_chunk_argv(path: str, offset: int, length: int) -> list[str]:
    """argv printing `length` bytes of `path` from byte `offset`."""
    return [SH, "-c", READ_CHUNK, "rollbox-read", path, str(int(offset)), str(int(length))]


def write_file_argv(path: str) -> list[str]:
    """argv writing its stdin to `path`, parents made first."""
    return [SH, "-c", WRITE_FILE, "rollbox-write", path]


def as_user_argv(user: str, cmd: list[str], *, set_home: bool) -> list[str]:
    """argv running `cmd` as `user` (name or numeric uid) from a root shell."""
    return [SH, "-c", AS_USER, "rollbox-user", user, "1" if set_home else "0", *cmd]


def identity_argv() -> list[str]:
    return [SH, "-c", IDENTITY]


def make_workdir_argv(path: str, owner: str | None) -> list[str]:
    return [SH, "-c", MAKE_WORKDIR, "rollbox-workdir", path, owner or ""]
