#!/usr/bin/env python3
"""runcell's in-sandbox bash kernel: one persistent bash, driven cell by cell.

Same protocol as the Python kernel (crates/protocol/src/lib.rs): framed JSON on
fd 3 (4-byte big-endian length + one UTF-8 JSON object, made and checked by
runcell_wire.py, which ships beside this file); fds 1 and 2 are raw pipes to the
host, and bash and everything it starts write there directly.

How a cell runs. The kernel writes the cell to a file and sends bash (on a pipe
that is bash's stdin) one line that sources it. bash reports back on a private
pipe, STATUS_FD, never on stdout: "start N" when it begins cell N, and
"end N <how> <status>" from PROMPT_COMMAND, which runs whenever bash is back at
its top level, whether the cell finished, failed or was aborted.

Why an *interactive* bash (``-i --noediting``, no job control, no history):
only an interactive shell, on SIGINT, abandons everything it is running (loops,
functions, the rest of the sourced cell) and returns to its top level with its
state intact. The same jump ends a cell early on ``exit N`` and under ``set -e``
without ending the session: the kernel's ``exit`` function and ERR trap note the
status and send the shell SIGINT. bash's own fd 2 is /dev/null (that hides its
start-up job-control warnings and the newline it prints on SIGINT); each cell
gets the real stderr through a redirection on its ``source`` command.

Known limits: the rest of an interrupted cell never runs; stdin, stdout and
stderr redirections made with ``exec`` last only until the end of their cell; the
kernel owns the INT and ERR traps (errtrace, ``set -E``, is on so the ERR trap
sees failures inside functions) and a read-only PROMPT_COMMAND, and ``exit`` is
a shell function. A cell that replaces the ERR trap and then fails under
``set -e``, or that execs another program, ends the session: the kernel reports
KernelDied and exits, and the host starts a new one.

Start it as ``python3 runcell_bash_kernel.py`` with the channel on fd 3 and
runcell_wire.py (from ../python in the source tree) in the same directory.
"""

import os
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import runcell_wire
from runcell_wire import CHANNEL_FD, ProtocolViolation

# Descriptor numbers inside bash: high enough to stay clear of the 3-9 that
# scripts use by hand. Cells never see them (their `source` closes them).
STATUS_FD = 60  # bash -> kernel: the start/end lines
STDERR_FD = 61  # the host's stderr pipe, lent to each cell as its fd 2
STDOUT_FD = 62  # the host's stdout pipe, lent to each cell as its fd 1 (an `exec 1>&-` lasts one cell)
BASH = ["/bin/bash", "--noprofile", "--norc", "--noediting", "-i", "+m", "+o", "history", "+H"]
EXIT_GRACE = 1.0  # seconds bash gets to exit at EOF before its process group is killed
RECHECK = 0.2  # seconds after an interrupt to look for processes it missed

# Sent to bash once, line by line, before anything else. `builtin` protects the
# kernel's plumbing from user functions named like builtins.
BASH_SETUP = r"""
builtin trap '' INT
PS1='' PS2='' PS0=''
builtin unset MAILCHECK
builtin shopt -s expand_aliases
__runcell_abort() { builtin trap - INT; builtin kill -INT "$$"; }
exit() {
    builtin local status=$?
    (( $# )) || builtin set -- "$status"
    # In a subshell, $(...) or a pipeline, exit ends just that, as always.
    [[ $BASHPID == "$$" ]] || builtin exit "$@"
    # In the shell itself it ends the cell, not the session. bash checks and
    # converts the argument (exit 300, exit foo) in a throwaway subshell.
    __runcell_exit=0
    (builtin exit "$@") || __runcell_exit=$?
    __runcell_abort
}
__runcell_on_err() {
    builtin local status=$?
    [[ $BASHPID == "$$" ]] || builtin return 0
    builtin set +e  # so bash does not exit; __runcell_done turns it back on
    __runcell_errexit=$status
    __runcell_abort
}
__runcell_status() { builtin return "$1"; }
__runcell_done() {
    builtin local status=$? how=end
    builtin trap '' INT  # between cells SIGINT is ignored, so a late one is harmless
    if [[ -n ${__runcell_exit-} ]]; then
        how=exit status=$__runcell_exit
    elif [[ -n ${__runcell_errexit-} ]]; then
        how=errexit status=$__runcell_errexit
        builtin set -e
    fi
    builtin unset __runcell_exit __runcell_errexit
    builtin printf 'end %s %s %s\n' "${__runcell_seq-0}" "$how" "$status" >&60
}
builtin trap '[[ $- != *e* ]] || __runcell_on_err 2>/dev/null' ERR
builtin set -E
PROMPT_COMMAND=__runcell_done
builtin readonly PROMPT_COMMAND
builtin readonly -f __runcell_abort __runcell_on_err __runcell_status __runcell_done
builtin printf 'ready %s.%s.%s\n' "${BASH_VERSINFO[@]:0:3}" >&60
"""


def warn(message):
    try:
        os.write(2, f"runcell: {message}\n".encode("utf-8", "replace"))
    except OSError:
        pass


class BashDied(Exception):
    """bash is gone (killed, crashed, or replaced by `exec`)."""


class InternalInterrupted(Exception):
    """The host interrupted a script of the kernel's own (a snapshot or restore)."""


class SessionOver(Exception):
    """Stop serving and exit with this code."""

    def __init__(self, code):
        super().__init__(code)
        self.code = code


class Channel:
    """Length-prefixed JSON frames on the fd 3 socket."""

    def __init__(self, fd):
        self.sock = socket.socket(fileno=fd)
        self.sock.set_inheritable(False)  # bash and its children never see it

    def fileno(self):
        return self.sock.fileno()

    def recv(self):
        """The next message, or None on a clean EOF between frames."""
        return runcell_wire.read_message(self._read_exact)

    def _read_exact(self, size):
        buf = bytearray()
        while len(buf) < size:
            try:
                chunk = self.sock.recv(size - len(buf))
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                if buf:
                    raise ProtocolViolation("channel closed in the middle of a frame")
                return None
            buf += chunk
        return bytes(buf)

    def has_data(self):
        try:
            return bool(self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
        except OSError:
            return False

    def closed(self):
        """True if the host has closed the channel (checked without consuming data)."""
        try:
            return self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    def send(self, message):
        self.sock.sendall(runcell_wire.encode(message))


class Shell:
    """The persistent bash process and the pipe it reports on."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="runcell-bash-")
        status_r, status_w = os.pipe()
        # Put the pipe's write end and a copy of our stderr at the numbers bash expects.
        os.dup2(status_w, STATUS_FD)
        os.dup2(2, STDERR_FD)
        os.dup2(1, STDOUT_FD)
        os.close(status_w)
        self.proc = subprocess.Popen(
            BASH,
            stdin=subprocess.PIPE,
            stdout=None,  # bash writes straight into the host's stdout pipe
            stderr=subprocess.DEVNULL,  # bash's own noise; cells get STDERR_FD
            pass_fds=(STATUS_FD, STDERR_FD, STDOUT_FD),
            process_group=0,  # its own group, so an interrupt reaches all its children
        )
        os.close(STATUS_FD)
        os.close(STDERR_FD)
        os.close(STDOUT_FD)
        self.status_fd = status_r
        self.pending = b""
        self.send_line(BASH_SETUP)
        self.version = self.wait_for("ready")[0]

    def send_line(self, text):
        try:
            self.proc.stdin.write(text.encode("utf-8", "replace") + b"\n")
            self.proc.stdin.flush()
        except OSError:  # BrokenPipeError: bash is gone
            raise BashDied() from None

    def read_line(self):
        """The next status line (blocking); BashDied once the pipe is at EOF."""
        while b"\n" not in self.pending:
            chunk = os.read(self.status_fd, 4096)
            if not chunk:
                raise BashDied()
            self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        return line.decode("utf-8", "replace").split()

    def has_line(self):
        return b"\n" in self.pending

    def wait_for(self, kind):
        while True:
            fields = self.read_line()
            if fields and fields[0] == kind:
                return fields[1:]

    def cell_command(self, seq, path, last_status):
        """The line that runs one cell. The backslashes stop user aliases.

        After "start", bash waits in `read` for the kernel's go-ahead line. An
        interrupt that came before the start is sent instead and lands in that
        `read`: sent any later, it could reach bash while it forks the cell's first
        program, which then would not get it (bash blocks SIGINT during fork).
        __runcell_status gives the cell the previous cell's $?; its `&& :` keeps
        a non-zero value from tripping `set -e`. The cell's own redirections:
        stdin from /dev/null (the kernel's commands stay unread), stdout and stderr
        from STDOUT_FD and STDERR_FD (so a cell that closes or replaces them with
        `exec` does it for itself alone), and the kernel fds closed so its processes
        never inherit them.
        """
        return (
            f"__runcell_seq={seq}; \\builtin trap - INT; "
            f"\\builtin printf 'start %s\\n' {seq} >&{STATUS_FD}; \\builtin read -r __runcell_go; "
            f"__runcell_status {last_status} && :; "
            f"\\builtin source {shlex.quote(path)} </dev/null 1>&{STDOUT_FD} 2>&{STDERR_FD} "
            f"{STDOUT_FD}>&- {STDERR_FD}>&- {STATUS_FD}>&-"
        )

    def interrupt(self):
        try:
            os.killpg(self.proc.pid, signal.SIGINT)
        except OSError:
            pass

    def interrupt_stragglers(self):
        """SIGINT again to group members that cannot have had the first one.

        A SIGINT that reaches bash while it forks misses the new child (bash blocks
        SIGINT then, or the child still has bash's handler and then execs), and bash
        waits for that child before giving up the cell. A member still alive with
        SIGINT at its default action (neither caught nor ignored) would have died
        of it, so it missed it. Programs catching SIGINT to clean up, background
        jobs (they ignore it) and bash are left alone.
        """
        try:
            names = os.listdir("/proc")
        except OSError:
            return
        for name in names:
            try:
                if not name.isdigit() or os.getpgid(int(name)) != self.proc.pid:
                    continue
                with open(f"/proc/{name}/status") as f:
                    masks = dict(line.split(":", 1) for line in f if line.startswith(("SigIgn", "SigCgt")))
                if not any(int(mask, 16) & (1 << (signal.SIGINT - 1)) for mask in masks.values()):
                    os.kill(int(name), signal.SIGINT)
            except (OSError, ValueError):
                pass

    def reap(self):
        """After bash is gone (or has become another program): kill what is left of its
        process group, and say how bash ended."""
        try:
            code = self.proc.wait(timeout=0.2)  # its status pipe closes just before it is waitable
        except subprocess.TimeoutExpired:
            code = None
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        if code is None:
            self.proc.wait()
            return "was replaced by another program (exec?)"
        return f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"

    def close(self):
        """At EOF: let bash exit (EXIT traps run), then kill its leftovers."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=EXIT_GRACE)
        except subprocess.TimeoutExpired:
            pass
        self.reap()
        shutil.rmtree(self.dir, ignore_errors=True)


class Kernel:
    def __init__(self, channel, shell):
        self.channel = channel
        self.shell = shell
        self.execution_count = 0
        self.last_status = 0
        self.running = False  # a cell has been sent to bash and has not ended
        self.started = False  # bash has said "start" for it: SIGINT now reaches the cell
        self.interrupted = False  # the host asked to interrupt this cell
        self.receiving = False  # a message is arriving; an interrupt now is for it
        self.early_interrupt = False
        self.recheck_at = None  # when to look for processes the interrupt missed
        self.snapshots = None  # BashSnapshots, made on the first snapshot or restore
        self.internal_seq = 0
        # Python restarts select() after a signal with its old timeout; this pipe
        # wakes it instead, so a recheck time set by on_sigint is seen.
        self.wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)

    def on_sigint(self, signum, frame):
        """The host interrupts a cell by sending SIGINT to this process.

        Forward it to bash's process group, but only once bash has begun the cell
        (before that it ignores SIGINT); an early one is forwarded on "start".
        Between cells it is dropped, unless an execute is already on its way: the
        host writes the execute before it signals, so the interrupt is for that.
        """
        if not self.running:
            if self.receiving or self.channel.has_data():
                self.early_interrupt = True
            return
        self.interrupted = True
        if self.started:
            self.forward_interrupt()

    def forward_interrupt(self):
        self.shell.interrupt()
        if self.recheck_at is None:
            self.recheck_at = time.monotonic() + RECHECK

    def serve(self):
        self.channel.send(
            {"type": "ready", "language": "bash", "version": self.shell.version, "pid": os.getpid()}
        )
        while True:
            # Watch bash too: if it dies between cells, the host should learn now.
            readable, _, _ = select.select([self.channel, self.shell.status_fd], [], [])
            if self.shell.status_fd in readable and self.channel not in readable:
                self.shell.read_line()  # a stray line, or BashDied
                continue
            self.receiving = True
            try:
                message = self.channel.recv()
            except ProtocolViolation as exc:
                warn(f"malformed frame on the protocol channel: {exc}")
                return 3
            if message is None:
                return 0
            self.dispatch(message)
            self.receiving = self.early_interrupt = False

    def dispatch(self, message):
        kind = message.get("type")
        if kind in ("snapshot", "restore"):
            self.handle_snapshot(kind, message)
            return
        if kind != "execute":
            self.protocol_error(None, f"unknown message type {kind!r}")
            return
        msg_id, code = message.get("id"), message.get("code")
        if not isinstance(msg_id, str):
            self.protocol_error(None, "execute needs a string 'id'")
        elif not isinstance(code, str):
            self.protocol_error(msg_id, "execute needs a string 'code'")
            self.done(msg_id, "error")
        else:
            if message.get("ack") is True:
                self.channel.send({"type": "started", "id": msg_id})
            self.execute(msg_id, code)

    def protocol_error(self, msg_id, text):
        self.error(msg_id, "ProtocolError", text)

    def error(self, msg_id, name, value):
        self.channel.send({"type": "error", "id": msg_id, "name": name, "value": value, "traceback": ""})

    def done(self, msg_id, status):
        self.channel.send(
            {"type": "done", "id": msg_id, "status": status, "execution_count": self.execution_count}
        )

    def execute(self, msg_id, code):
        self.execution_count += 1
        seq = self.execution_count
        os.makedirs(self.shell.dir, mode=0o700, exist_ok=True)  # in case a cell removed it
        path = os.path.join(self.shell.dir, f"cell-{seq}.sh")
        with open(path, "w", encoding="utf-8", errors="replace") as f:
            f.write(code)
        self.running, self.started, self.interrupted = True, False, self.early_interrupt
        self.recheck_at = None
        self.drain_wakeups()  # left by signals between cells
        try:
            self.shell.send_line(self.shell.cell_command(seq, path, self.last_status))
            how, status = self.wait_for_end(seq)
        except BashDied:
            self.running = False
            how = self.shell.reap()
            self.error(msg_id, "KernelDied", f"bash {how}; the session is over")
            # No `done`: the host sees the channel close and starts a new session.
            raise SessionOver(1) from None
        finally:
            self.running = False
            try:
                os.unlink(path)  # bash read the whole file before running it
            except OSError:
                pass
        self.last_status = status
        if how == "end" and self.interrupted and status != 0:
            self.error(msg_id, "KeyboardInterrupt", "")
            self.done(msg_id, "interrupted")
        elif status != 0:
            self.error(msg_id, "ExitCode", str(status))
            self.done(msg_id, "error")
        else:
            self.done(msg_id, "ok")

    def handle_snapshot(self, kind, message):
        """`snapshot` or `restore` {id, path}: answered like a cell (the report or an error,
        then `done`), outside the execution count."""
        msg_id, path = message.get("id"), message.get("path")
        if not isinstance(msg_id, str):
            self.protocol_error(None, f"{kind} needs a string 'id'")
            return
        if not isinstance(path, str) or not path:
            self.protocol_error(msg_id, f"{kind} needs a string 'path'")
            self.done(msg_id, "error")
            return
        try:
            if self.snapshots is None:
                self.snapshots = BashSnapshots(self)
            run = self.snapshots.snapshot if kind == "snapshot" else self.snapshots.restore
            report = run(path)
        except InternalInterrupted:
            self.error(msg_id, "KeyboardInterrupt", "")
            self.done(msg_id, "interrupted")
            return
        except BashDied:
            how = self.shell.reap()
            self.error(msg_id, "KernelDied", f"bash {how}; the session is over")
            raise SessionOver(1) from None
        except Exception as exc:
            refused = getattr(self.snapshots, "snap", None)
            if refused is not None and isinstance(exc, refused.Refused):
                self.channel.send({"type": "snapshot_refused", "id": msg_id, "refusal": exc.refusal()})
            else:
                self.error(msg_id, "SnapshotError", f"{type(exc).__name__}: {exc}")
            self.done(msg_id, "error")
            return
        self.channel.send(dict(report, type="snapshotted" if kind == "snapshot" else "restored", id=msg_id))
        self.done(msg_id, "ok")

    def run_internal(self, script):
        """Run a script of the kernel's in the shell as a cell runs (interruptible, with the
        shell's state), but not counted and not reported; `$?` of the next cell is still the
        last cell's. InternalInterrupted if the host interrupted it."""
        self.internal_seq += 1
        seq = f"internal{self.internal_seq}"
        os.makedirs(self.shell.dir, mode=0o700, exist_ok=True)
        path = os.path.join(self.shell.dir, f"{seq}.sh")
        with open(path, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(script)
        self.running, self.started, self.interrupted = True, False, self.early_interrupt
        self.recheck_at = None
        self.drain_wakeups()
        try:
            self.shell.send_line(self.shell.cell_command(seq, path, self.last_status))
            how, status = self.wait_for_end(seq)
        finally:
            self.running = False
            try:
                os.unlink(path)
            except OSError:
                pass
        if self.interrupted and how == "end" and status != 0:
            raise InternalInterrupted()
        return how, status

    def drain_wakeups(self):
        try:
            while os.read(self.wake_r, 512):
                pass
        except BlockingIOError:
            pass

    def wait_for_end(self, seq):
        """(how, status) of cell `seq`. Lines about earlier cells are stale and skipped."""
        watch_channel = True
        while True:
            if not self.shell.has_line():
                fds = [self.shell.status_fd, self.wake_r] + ([self.channel] if watch_channel else [])
                timeout = None if self.recheck_at is None else max(0.0, self.recheck_at - time.monotonic())
                readable, _, _ = select.select(fds, [], [], timeout)
                if self.wake_r in readable:
                    self.drain_wakeups()
                    continue
                if not readable:  # the recheck time has come
                    self.recheck_at = None
                    self.shell.interrupt_stragglers()
                    continue
                if self.channel in readable:
                    if self.channel.closed():  # the host is gone: so is the session
                        self.shell.reap()
                        raise SessionOver(0)
                    watch_channel = False  # data during a cell waits for the next recv
                if self.shell.status_fd not in readable:
                    continue
            fields = self.shell.read_line()
            if len(fields) < 2 or fields[1] != str(seq):
                continue
            if fields[0] == "start":
                # SIGINT blocked: on_sigint must see `started` and the go-ahead agree.
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
                try:
                    self.started = True
                    if self.interrupted:
                        self.forward_interrupt()
                    else:
                        self.shell.send_line(":")  # the go-ahead (a no-op if ever run as a command)
                finally:
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
            elif fields[0] == "end" and len(fields) == 4:
                return fields[2], int(fields[3])


# --------------------------------------------------------------------------
# Snapshots (issue 17): the shell's state to a file and back
# --------------------------------------------------------------------------

# What a snapshot holds: the shell's variables (with their attributes: arrays, exported,
# integer...), functions, aliases, a few `set -o` options and the working directory, as the
# shell's own `declare -p`, `declare -pf`, `alias` and `set +o` print them, NUL-separated
# (no name or value of bash's can hold a NUL). `\builtin` and the backslashes defeat user
# functions and aliases named like the builtins; `|| :` keeps `set -e` from ending it.
SNAPSHOT_SCRIPT = r"""
\builtin mapfile -t __runcell_v < <(\builtin compgen -v)
\builtin mapfile -t __runcell_f < <(\builtin compgen -A function)
\builtin mapfile -t __runcell_a < <(\builtin compgen -a)
{
for __runcell_n in "${__runcell_v[@]}"; do
    \builtin printf 'v %s\0' "$__runcell_n"; \builtin declare -p -- "$__runcell_n" 2>/dev/null || :; \builtin printf '\0'
done
for __runcell_n in "${__runcell_f[@]}"; do
    \builtin printf 'f %s\0' "$__runcell_n"; \builtin declare -pf -- "$__runcell_n" 2>/dev/null || :; \builtin printf '\0'
done
for __runcell_n in "${__runcell_a[@]}"; do
    \builtin printf 'a %s\0' "$__runcell_n"; \builtin alias -- "$__runcell_n" 2>/dev/null || :; \builtin printf '\0'
done
\builtin printf 'o set\0'; \builtin set +o; \builtin printf '\0'
\builtin printf 'c cwd\0%s\0' "$PWD"
} >{out}
\builtin unset __runcell_v __runcell_f __runcell_a __runcell_n
"""
# bash's own variables: the new shell has its own (dynamic, read-only or set at start-up,
# like HOSTNAME and an interactive shell's TERM=dumb).
BASH_OWN = frozenset(
    """BASH BASHOPTS BASHPID BASH_ALIASES BASH_ARGC BASH_ARGV BASH_ARGV0 BASH_CMDS BASH_COMMAND
    BASH_EXECUTION_STRING BASH_LINENO BASH_LOADABLES_PATH BASH_REMATCH BASH_SOURCE BASH_SUBSHELL
    BASH_VERSINFO BASH_VERSION COLUMNS COMP_WORDBREAKS DIRSTACK EPOCHREALTIME EPOCHSECONDS EUID
    FUNCNAME GROUPS HISTCMD HISTFILE HISTFILESIZE HISTSIZE HOSTNAME HOSTTYPE LINENO LINES MACHTYPE
    MAILCHECK OLDPWD OPTERR OPTIND OSTYPE PIPESTATUS PPID PROMPT_COMMAND PS0 PS1 PS2 PS4 PWD
    RANDOM SECONDS SHELL SHELLOPTS SHLVL SRANDOM TERM UID _""".split()
)
# `set -o` options a session may set and get back; the kernel owns the others (errtrace,
# monitor, history, the editing modes) and some would break it (noexec).
SNAPSHOT_OPTIONS = frozenset("errexit nounset pipefail noglob noclobber allexport xtrace verbose".split())
# The kernel's own functions (see BASH_SETUP): the new shell defines them itself.
KERNEL_FUNCTIONS = frozenset(("exit",))


def _snapshot_module():
    """runcell_snapshot.py: beside this file in the sandbox, in ../python in the source tree."""
    import importlib.util

    here = os.path.dirname(os.path.realpath(__file__))
    for directory in (here, os.path.join(here, "..", "python")):
        path = os.path.join(directory, "runcell_snapshot.py")
        if os.path.exists(path):
            spec = importlib.util.spec_from_file_location("runcell_snapshot", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    raise ImportError(f"runcell_snapshot.py is not beside {here}")


def _declare_scalar(name, value):
    """`declare -p`'s line for an exported scalar holding `value` (bash's double quoting)."""
    escaped = "".join("\\" + c if c in '"\\$`' else c for c in value)
    return f'declare -x {name}="{escaped}"'


def parse_snapshot_output(data, environment):
    """(entries, skipped) from SNAPSHOT_SCRIPT's output: entries (kind, name, text) to save,
    skipped [{name, reason}]. Variables inherited from the environment and never changed are
    the sandbox's, not the session's: the new session gets its own, so they are not saved."""
    fields = data.split(b"\0")
    entries, skipped = [], []
    for tag, body in zip(fields[0::2], fields[1::2]):
        tag = tag.decode("utf-8", "surrogateescape")
        text = body.decode("utf-8", "surrogateescape").rstrip("\n")
        kind, _, name = tag.partition(" ")
        if not text or name.startswith("__runcell_"):
            continue
        if kind == "v":
            if name in BASH_OWN:
                continue
            flags = text.split(" ", 2)[1] if text.startswith("declare -") else ""
            if name in environment and text == _declare_scalar(name, environment[name]):
                continue
            if "r" in flags:
                skipped.append({"name": name, "reason": "readonly variable"})
                continue
            entries.append(("variable", name, text))
        elif kind == "f":
            if name in KERNEL_FUNCTIONS:
                continue
            entries.append(("function", f"{name}()", text))
        elif kind == "a":
            entries.append(("alias", f"alias {name}", text))
        elif kind == "o":
            lines = [
                line
                for line in text.splitlines()
                if len(line.split()) == 3 and line.split()[2] in SNAPSHOT_OPTIONS and line.split()[1] == "-o"
            ]
            if lines:
                entries.append(("options", "set -o", "\n".join(lines)))
        elif kind == "c":
            entries.append(("cwd", "cwd", text))
    return entries, skipped


def restore_script(entries, errors):
    """The script that puts `entries` back, one at a time: each that fails leaves its error in
    `errors`/<index> and the others go on."""
    lines = []
    for index, (kind, _name, text) in enumerate(entries):
        err = shlex.quote(os.path.join(errors, str(index)))
        if kind == "cwd":
            command = f"\\builtin cd -- {shlex.quote(text)}"
        else:
            # eval at the top level (cells are sourced there): `declare` makes globals.
            command = f"\\builtin eval -- {shlex.quote(text)}"
        lines.append(f"{command} 2>{err} || \\builtin printf 'failed\\n' >>{err}")
    return "\n".join(lines) + "\n"


class BashSnapshots:
    """The bash kernel's `snapshot` and `restore`: run as internal cells in the shell (not
    counted), the file written and checked by runcell_snapshot.py."""

    SERIALIZER = "bash-declare"
    SERIALIZER_VERSION = "1"

    def __init__(self, kernel):
        self.kernel = kernel
        self.snap = _snapshot_module()
        self.environment = dict(os.environ)  # what bash inherited at its start
        self.seq = 0

    def snapshot(self, path):
        started = time.monotonic()
        shell = self.kernel.shell
        out = os.path.join(shell.dir, "snapshot.out")
        self.kernel.run_internal(SNAPSHOT_SCRIPT.replace("{out}", shlex.quote(out)))
        try:
            with open(out, "rb") as f:
                data = f.read()
        finally:
            os.unlink(out)
        entries, skipped = parse_snapshot_output(data, self.environment)
        pieces = [text.encode("utf-8", "surrogateescape") for _, _, text in entries]
        header = {
            "language": "bash",
            "language_version": shell.version,
            "serializer": self.SERIALIZER,
            "serializer_version": self.SERIALIZER_VERSION,
            "entries": [
                {"name": name, "kind": kind, "sizes": [len(piece)]}
                for (kind, name, _), piece in zip(entries, pieces)
            ],
        }
        size = self.snap.write(path, header, pieces)
        names, skipped, omitted = self.snap.report_lists([name for _, name, _ in entries], skipped)
        return {
            "bytes": size,
            "names": names,
            "skipped": skipped,
            "omitted": omitted,
            "duration_us": int((time.monotonic() - started) * 1e6),
        }

    def restore(self, path):
        started = time.monotonic()
        snap = self.snap
        header, pieces = snap.read(path)
        snap.check(header, "language", "bash")
        snap.check(header, "language_version", self.kernel.shell.version, snap.same_major)
        snap.check(header, "serializer", self.SERIALIZER)
        snap.check(header, "serializer_version", self.SERIALIZER_VERSION)
        entries = []
        for entry, entry_pieces in zip(header["entries"], pieces):
            kind, name = entry.get("kind"), entry.get("name")
            if kind in ("variable", "function", "alias", "options", "cwd") and isinstance(name, str):
                text = b"".join(entry_pieces).decode("utf-8", "surrogateescape")
                entries.append((kind, name, text))
        # Options last: `set -e` or `set -u` must not stop the rest of the restore.
        entries.sort(key=lambda e: e[0] == "options")
        errors = tempfile.mkdtemp(prefix="restore-", dir=self.kernel.shell.dir)
        try:
            self.kernel.run_internal(restore_script(entries, errors))
            names, skipped = [], []
            for index, (kind, name, _) in enumerate(entries):
                try:
                    with open(os.path.join(errors, str(index)), encoding="utf-8", errors="replace") as f:
                        err = f.read().strip()
                except OSError:
                    err = ""
                if err.endswith("failed"):
                    why = err[: -len("failed")].strip().splitlines()
                    skipped.append(snap.skip(name, f"cannot be restored ({why[-1] if why else 'failed'})"))
                else:
                    names.append(name)
        finally:
            shutil.rmtree(errors, ignore_errors=True)
        names, skipped, omitted = snap.report_lists(names, skipped)
        return {
            "names": names,
            "skipped": skipped,
            "omitted": omitted,
            "duration_us": int((time.monotonic() - started) * 1e6),
        }


def main():
    try:
        os.fstat(CHANNEL_FD)
    except OSError:
        sys.stderr.write("runcell bash kernel: fd 3 (the protocol channel) is not open\n")
        return 2
    channel = Channel(CHANNEL_FD)
    kernel = Kernel(channel, None)
    # Installed before bash starts, so bash inherits SIGINT as default, not ignored.
    signal.signal(signal.SIGINT, kernel.on_sigint)
    try:
        kernel.shell = Shell()
    except BashDied:
        warn("bash did not start")
        return 1
    try:
        code = kernel.serve()
    except BashDied:
        warn(f"bash {kernel.shell.reap()}; the session is over")
        code = 1
    except SessionOver as over:
        code = over.code
    except (BrokenPipeError, ConnectionResetError):
        code = 0  # the host closed the channel while we were writing
    kernel.shell.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
