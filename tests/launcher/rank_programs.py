"""Programs the launcher tests run as ranks under `mccl launch` (one per rank, with torchrun's variables).

    python rank_programs.py env                      # print this rank's launcher variables and cwd as JSON
    python rank_programs.py sleep DIR [--ignore-int] # start a grandchild, record both pids in DIR, sleep
    python rank_programs.py fail DIR RANK CODE       # rank RANK exits CODE once every other rank sleeps
    python rank_programs.py allreduce                # mccl allreduce over env:// and print the result
    python rank_programs.py flaky DIR RANK CODE N    # record this attempt; on the first N attempts rank RANK
                                                     # exits CODE once the others sleep, later attempts exit 0
    python rank_programs.py secret DIR               # mccl allreduce (authenticated with MCCL_AUTH_SECRET),
                                                     # record it in DIR, stay in the job until DIR/go appears
    python rank_programs.py usage DIR                # every rank prints the same usage text and error (as
                                                     # LightningCLI on a bad config) and, once all have, exits 2
    python rank_programs.py killed DIR               # rank 1 kills itself (SIGKILL) once rank 0 waits; rank 0,
                                                     # asked to stop, prints a traceback twice and exits 1

Only `allreduce` imports torch (slow); the others use the standard library, to keep the tests fast.
"""
import json
import os
import signal
import subprocess
import sys
import time
import traceback

VARS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK",
        "GROUP_RANK", "MCCL_NODE_RANK", "MCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "PYTHONUNBUFFERED",
        "MCCL_TEST_FORWARDED")
RESTART_VARS = ("MCCL_RESTART_COUNT", "MCCL_MAX_RESTARTS", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
                "MASTER_PORT")
SLEEP_S = 120


def rank() -> int:
    return int(os.environ["RANK"])


def write_json(path, obj) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)  # readers never see half a file


def sleep(out_dir, ignore_int=False) -> None:
    if ignore_int:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited by the grandchild too
    # A grandchild: the launcher must not leave it behind either.
    child = subprocess.Popen(["sleep", str(SLEEP_S)])
    write_json(os.path.join(out_dir, f"pids-{rank()}.json"), {"rank": os.getpid(), "child": child.pid})
    print(f"rank {rank()} sleeping", flush=True)
    time.sleep(SLEEP_S)


def fail(out_dir, failing_rank, code) -> None:
    if rank() != failing_rank:
        sleep(out_dir)
        return
    others = [r for r in range(int(os.environ["WORLD_SIZE"])) if r != failing_rank]
    deadline = time.time() + 60
    while not all(os.path.exists(os.path.join(out_dir, f"pids-{r}.json")) for r in others):
        if time.time() > deadline:
            sys.exit("the other ranks never started")
        time.sleep(0.05)
    print(f"rank {rank()} failing with exit code {code}", flush=True)
    write_json(os.path.join(out_dir, "failed.json"), {"pid": os.getpid(), "time": time.time()})
    sys.exit(code)


def flaky(out_dir, failing_rank, code, failing_attempts) -> None:
    """Attempt k writes attempt-<k>-rank<R>.json (its restart variables and pid); on the first
    `failing_attempts` attempts rank `failing_rank` fails (see `fail`), the others sleep until stopped."""
    attempt = int(os.environ["MCCL_RESTART_COUNT"])
    write_json(os.path.join(out_dir, f"attempt-{attempt}-rank{rank()}.json"),
               {"env": {k: os.environ.get(k) for k in RESTART_VARS}, "pid": os.getpid()})
    print(f"rank {rank()} attempt {attempt}", flush=True)
    if attempt >= failing_attempts:
        return
    attempt_dir = os.path.join(out_dir, f"attempt-{attempt}")
    os.makedirs(attempt_dir, exist_ok=True)
    fail(attempt_dir, failing_rank, code)


def allreduce() -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    import lightning_mccl  # noqa: F401  (registers the backend)

    dist.init_process_group("mccl", timeout=timedelta(seconds=60))
    t = torch.full((4,), float(dist.get_rank() + 1))
    dist.all_reduce(t)
    print(f"allreduce rank={dist.get_rank()} world={dist.get_world_size()} env_rank={os.environ['RANK']} "
          f"local_rank={os.environ['LOCAL_RANK']} node_rank={os.environ['NODE_RANK']} sum={t.tolist()}", flush=True)
    dist.destroy_process_group()


def secret(out_dir) -> None:
    """The job the command-line scan watches: an allreduce between ranks that hold MCCL_AUTH_SECRET, and
    then every rank stays in the job (a barrier after) until the test has scanned and writes DIR/go. Prints
    and records only a hash of the secret."""
    import hashlib
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    import lightning_mccl  # noqa: F401  (registers the backend)

    dist.init_process_group("mccl", timeout=timedelta(seconds=60))
    t = torch.full((4,), float(dist.get_rank() + 1))
    dist.all_reduce(t)
    digest = {k: hashlib.sha256(os.environ[k].encode()).hexdigest() if k in os.environ else None
              for k in ("MCCL_AUTH_SECRET", "MY_API_TOKEN")}
    write_json(os.path.join(out_dir, f"ready-{rank()}.json"), {"sum": t.tolist(), "sha256": digest, "pid": os.getpid()})
    deadline = time.time() + 60
    while not os.path.exists(os.path.join(out_dir, "go")):
        if time.time() > deadline:
            sys.exit("the test never said go")
        time.sleep(0.05)
    dist.barrier()
    dist.destroy_process_group()


USAGE = ["usage: train.py [options] fit [-c CONFIG]"] + [f"{' ' * 30}[--option.number_{i} VALUE]" for i in range(30)]
USAGE_ERROR = ['error: Parser key "trainer.strategy":', '  Errors:', '    - Problem with given class_path:',
               '        Parser key "compress":', "          Errors:", "            - Expected a Literal['bf16']",
               "          Given value: bf17"]


def wait_for_all(out_dir, name) -> None:
    """Writes DIR/<name>-<rank> and waits (at most 60 s) until every rank has."""
    open(os.path.join(out_dir, f"{name}-{rank()}"), "w").close()
    deadline = time.time() + 60
    while not all(os.path.exists(os.path.join(out_dir, f"{name}-{r}")) for r in range(int(os.environ["WORLD_SIZE"]))):
        if time.time() > deadline:
            sys.exit(f"the other ranks never wrote {name}")
        time.sleep(0.05)


def usage(out_dir) -> None:
    sys.stderr.write("\n".join(USAGE + USAGE_ERROR) + "\n")
    sys.stderr.flush()
    wait_for_all(out_dir, "printed")
    time.sleep(0.5)  # every copy has reached the launcher before the first exit
    sys.exit(2)


def killed(out_dir) -> None:
    if rank() == 1:
        wait_for_all(out_dir, "started")
        os.kill(os.getpid(), signal.SIGKILL)

    def lost_peer(signum, frame):
        try:
            raise RuntimeError("rank 1 closed its connection")
        except RuntimeError:
            traceback.print_exc()  # as Lightning's handler and then Python's own do
            raise

    signal.signal(signal.SIGTERM, lost_peer)
    wait_for_all(out_dir, "started")
    time.sleep(SLEEP_S)


def main(argv) -> None:
    mode = argv[0]
    if mode == "env":
        print(json.dumps({"env": {k: os.environ.get(k) for k in VARS}, "cwd": os.getcwd(),
                          "python": sys.executable}), flush=True)
    elif mode == "sleep":
        sleep(argv[1], ignore_int="--ignore-int" in argv)
    elif mode == "fail":
        fail(argv[1], int(argv[2]), int(argv[3]))
    elif mode == "flaky":
        flaky(argv[1], int(argv[2]), int(argv[3]), int(argv[4]))
    elif mode == "allreduce":
        allreduce()
    elif mode == "secret":
        secret(argv[1])
    elif mode == "usage":
        usage(argv[1])
    elif mode == "killed":
        killed(argv[1])
    else:
        sys.exit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
