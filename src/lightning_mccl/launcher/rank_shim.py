"""The rank shim: runs one rank's command on its host and obeys the launcher through stdin.

`mccl launch` never starts a rank's command directly. On every host (this one for ``--local``, the
remote one at the end of an ``ssh`` connection) it starts this small, stdlib-only program, which:

- reads the rank's spec (its command, working directory and environment) from the first line of stdin:
  never from its argv, which every user of the host can read (``ps``), since the environment may hold
  MCCL_AUTH_SECRET or other secrets;
- changes to the rank's working directory, adds the rank's environment (RANK, MASTER_ADDR, ...) and starts
  the command as the leader of a new session, so the command and everything it starts (data-loader
  workers, ...) share one process group;
- sets GLOO_SOCKET_IFNAME, unless the rank's environment has it, to the interface the mccl engine listens
  on (MCCL_SOCKET_IFNAME, else the one that routes to MASTER_ADDR: `host_net.gloo_interface`), so that
  Lightning's own Gloo group does not listen where the host's name resolves (loopback, Wi-Fi);
- reads control lines from stdin: ``INT``, ``TERM``, ``KILL`` send that signal to the whole process group;
- on end of file of stdin (the launcher died, or its ``ssh`` connection dropped) sends SIGTERM to the
  group and SIGKILL ``grace`` seconds later, so no rank outlives its launcher;
- with MCCL_CAFFEINATE ``on`` (or ``auto`` on macOS) in the rank's environment, runs ``caffeinate -ims -w
  PID`` beside the command, so the Mac does not idle-, system- or disk-sleep until the command exits; not
  ``-d``: a display kept awake is what sets off macOS 26's GPU watchdog ("Impacting Interactivity") under
  sustained Metal work, so the display may sleep;
- when the command exits, kills whatever it left behind in its process group (an orphan holding the
  output pipe open would keep ``ssh`` from ever returning) and exits with the command's exit code
  (128 + N for a command killed by signal N, as shells report it).

Why not ``ssh -tt`` (a remote pseudo-terminal whose hang-up kills the remote side)? A pty merges stderr
into stdout, turns ``\\n`` into ``\\r\\n``, and delivers only SIGHUP, not Ctrl-C, and only when the
connection closes. A plain pipe plus this shim gives the same behaviour for ``--local`` and ``ssh``
(so the local tests exercise the real supervision), forwards SIGINT as SIGINT (Lightning's graceful
KeyboardInterrupt shutdown), and needs only the Python the rank runs with.

The launcher runs this file's source through ``python -c`` (see ``shim_argv``): the remote host needs no
copy of it, and importing it does not import torch. It must stay compatible with Python 3.10 (the package's
oldest) and use nothing outside the standard library, but for `host_net` (standard library only itself),
imported from the lightning-mccl of the rank's Python: without it there, Gloo picks its interface by itself.
"""
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import threading

# caffeinate's assertions: no idle (-i), disk (-m) or system (-s) sleep; never -d (see the module docstring).
CAFFEINATE_FLAGS = ("-ims",)
# The control lines the launcher writes to a rank's stdin, and the signals they send to the rank.
CONTROL_SIGNALS = {"INT": signal.SIGINT, "TERM": signal.SIGTERM, "KILL": signal.SIGKILL}


def encode_spec(spec):
    """The first line the launcher writes to this program's stdin: the rank's spec as base64'd JSON (one
    line of ASCII, whatever the environment holds)."""
    return base64.b64encode(json.dumps(spec, sort_keys=True).encode()).decode("ascii")


def decode_spec(text):
    return json.loads(base64.b64decode(text.encode("ascii")).decode())


def _say(label, message):
    try:
        sys.stderr.write("mccl-rank[%s]: %s\n" % (label, message))
        sys.stderr.flush()
    except (OSError, ValueError):  # nobody is listening any more (the launcher is gone)
        pass


def _caffeinate(mode, pid, env, label):
    """`caffeinate -ims -w pid` (macOS's keep-awake tool, stopping by itself when `pid` exits), or None."""
    if mode == "off" or (mode != "on" and sys.platform != "darwin"):
        return None
    path = shutil.which("caffeinate", path=env.get("PATH"))
    if path is None:
        _say(label, "caffeinate not found: this host may sleep during the job (see pmset)")
        return None
    try:
        return subprocess.Popen([path, *CAFFEINATE_FLAGS, "-w", str(pid)], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError as e:
        _say(label, "cannot start caffeinate: %s" % e)
        return None


def _signal_group(pgid, sig):
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _gloo_interface(env):
    """GLOO_SOCKET_IFNAME for a rank with environment `env` (lightning_mccl.launcher.host_net), or None."""
    try:
        from lightning_mccl.launcher.host_net import gloo_interface
    except ImportError:  # the rank's Python has no lightning-mccl (or an older one)
        return None
    return gloo_interface(env)


def read_spec_line(fd=0):
    """The first line of `fd` (without its newline) and whatever followed it; None at end of file first."""
    data = b""
    while b"\n" not in data:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            chunk = b""
        if not chunk:
            return None, b""
        data += chunk
    line, rest = data.split(b"\n", 1)
    return line.decode("ascii", "replace"), rest


def main():
    """spec (stdin's first line): {"argv": [...], "cwd": str or None, "env": {name: value}, "grace":
    seconds, "label": str}; control lines follow it."""
    line, after_spec = read_spec_line()
    if line is None:
        _say("rank", "stdin closed before the launcher sent this rank's spec")
        return 2
    spec = decode_spec(line)
    label = spec.get("label", "rank")
    argv = list(spec["argv"])
    env = dict(os.environ)
    env.update(spec.get("env") or {})
    gloo = _gloo_interface(env)
    if gloo:
        env["GLOO_SOCKET_IFNAME"] = gloo
    cwd = spec.get("cwd")
    grace = float(spec.get("grace", 10.0))
    if cwd:
        try:
            os.chdir(cwd)
        except OSError as e:
            _say(label, "cannot change to the working directory %s: %s" % (cwd, e.strerror))
            return 1
    # A launcher started in the background (`mccl launch ... &`, nohup) passes SIGINT on as ignored, and an
    # ignored signal stays ignored across exec: the command would never see the INT this shim forwards.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        child = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    except FileNotFoundError:
        _say(label, "command not found: %s" % argv[0])
        return 127
    except PermissionError:
        _say(label, "command not executable: %s" % argv[0])
        return 126
    pgid = child.pid  # the session (and process group) leader
    awake = _caffeinate(env.get("MCCL_CAFFEINATE", "off"), child.pid, env, label)
    exited = threading.Event()
    killed = []

    def forward(signum, frame):
        _signal_group(pgid, signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, forward)

    def read_control():
        # os.read on the raw descriptor, not sys.stdin: a daemon thread blocked inside a buffered reader
        # makes the interpreter abort at exit ("could not acquire lock for <stdin>").
        pending, data = b"", after_spec
        while True:
            if not data:
                try:
                    data = os.read(0, 4096)
                except OSError:
                    data = b""
                if not data:
                    break
            lines = (pending + data).split(b"\n")
            pending = lines.pop()
            for line in lines:
                sig = CONTROL_SIGNALS.get(line.strip().decode("ascii", "replace"))
                if sig is not None and not exited.is_set():
                    _signal_group(pgid, sig)
                    killed.append(sig == signal.SIGKILL)
            data = b""
        if exited.is_set() or any(killed):  # ended by the launcher: nothing left to do
            return
        _say(label, "the launcher is gone (stdin closed): terminating the rank")
        _signal_group(pgid, signal.SIGTERM)
        if not exited.wait(grace):
            _signal_group(pgid, signal.SIGKILL)

    threading.Thread(target=read_control, name="mccl-control", daemon=True).start()
    code = child.wait()
    exited.set()
    _signal_group(pgid, signal.SIGKILL)  # whatever the command left behind in its group
    if awake is not None and awake.poll() is None:
        awake.kill()
        awake.wait()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    _code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_code)  # no interpreter teardown while the control thread sits in read()
