"""scripts/slurm_train.sh under stub ``sbatch``/``srun``/``scontrol`` (written here into tmp_path/bin): a 2-node x
2-task job on a compressed node list, one GPU id per task, the time-limit warning (``--signal=B:USR1@300``) that
saves, requeues and resumes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

from tests.support.helpers import DIST_ENTRY, ROOT, base_env, held_step, kill_tree, reports, write_opt
from utils.utils_checkpoint import complete_steps

# Stub sbatch: runs the job right here, synchronously (SLURM's side of it: the job's variables, the batch shell, one
# more run per `scontrol requeue` of the job, with SLURM_RESTART_COUNT counting them).
SBATCH = '''
import json, os, re, subprocess, sys
stub = os.environ["STUB_DIR"]
args, opts = sys.argv[1:], {}
while args and args[0].startswith("--"):
    key, _, value = args.pop(0)[2:].partition("=")
    opts[key] = value
script, script_args = args[0], args[1:]
for line in open(script):
    match = re.match(r"#SBATCH --([\\w-]+)(?:=(\\S+))?", line)
    if match:
        opts.setdefault(match.group(1), match.group(2) or "")
json.dump(opts, open(os.path.join(stub, "directives.json"), "w"))
nodes, per_node = int(opts["nodes"]), int(opts["ntasks-per-node"])
job = os.environ["STUB_JOB_ID"]
env = dict(os.environ, SLURM_JOB_ID=job, SLURM_JOBID=job, SLURM_JOB_NODELIST=os.environ["STUB_NODELIST"],
           SLURM_NODELIST=os.environ["STUB_NODELIST"], SLURM_JOB_NUM_NODES=str(nodes), SLURM_NNODES=str(nodes),
           SLURM_NTASKS=str(nodes * per_node), SLURM_NTASKS_PER_NODE=str(per_node), SLURM_SUBMIT_DIR=os.getcwd(),
           SLURM_JOB_NAME=opts.get("job-name", "job"))
log = os.path.join(stub, "scontrol.log")
requeues = lambda: open(log).read().count(f"requeue {job}") if os.path.exists(log) else 0
print(f"Submitted batch job {job}", flush=True)
for restart in range(3):
    if restart:
        env["SLURM_RESTART_COUNT"] = str(restart)
    before = requeues()
    proc = subprocess.Popen(["bash", script, *script_args], env=env)
    open(os.path.join(stub, "batch.pid"), "w").write(str(proc.pid))
    code = proc.wait()
    open(os.path.join(stub, "jobs.log"), "a").write(f"run {restart} exit {code}\\n")
    if requeues() == before:
        break
sys.exit(code)
'''

# Stub srun: SLURM_NTASKS tasks of the command as local processes with SLURM's task variables and one GPU id each
# (--gpus-per-task=1 binding); SIGUSR1/SIGTERM/SIGINT are passed on to them, as srun does; --kill-on-bad-exit. The
# training entry main_train_vrt.py is swapped for tests/support/dist_entry.py: the same main() plus the test's step
# gate and per-rank reports.
SRUN = '''
import os, signal, subprocess, sys, time
args = sys.argv[1:]
while args and args[0].startswith("-"):
    args.pop(0)
cmd = [sys.executable if a == "python" else os.environ["STUB_ENTRY"] if a == "main_train_vrt.py" else a for a in args]
ntasks, per_node = int(os.environ["SLURM_NTASKS"]), int(os.environ["SLURM_NTASKS_PER_NODE"])
procs = []
for task in range(ntasks):
    env = dict(os.environ, SLURM_PROCID=str(task), SLURM_LOCALID=str(task % per_node),
               SLURM_NODEID=str(task // per_node), SLURM_STEP_ID="0", CUDA_VISIBLE_DEVICES=str(task % per_node))
    procs.append(subprocess.Popen(cmd, env=env))


def forward(signum, frame):
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signum)


for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, forward)
code, pending = 0, list(procs)
while pending:
    for proc in list(pending):
        if proc.poll() is not None:
            pending.remove(proc)
            if proc.returncode and not code:
                code = proc.returncode if proc.returncode > 0 else 128 - proc.returncode
                for other in pending:
                    other.kill()
    time.sleep(0.05)
sys.exit(code)
'''

SCONTROL = '''
import os, sys
open(os.path.join(os.environ["STUB_DIR"], "scontrol.log"), "a").write(" ".join(sys.argv[1:]) + "\\n")
'''


def _stubs(tmp_path) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("sbatch", SBATCH), ("srun", SRUN), ("scontrol", SCONTROL)):
        path = bin_dir / name
        path.write_text(f"#!{sys.executable}\n{body}")
        path.chmod(0o755)
    return str(bin_dir)


def _job_id_with_free_port() -> tuple[str, int]:
    """A job id whose MASTER_PORT (the script's 20000 + id % 20000) is free here."""
    for port in range(21000 + os.getpid() % 15000, 40000):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return str(port), port
    raise RuntimeError("no free port in 21000-40000")


def _wait_for(predicate, proc, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise AssertionError(f"{what} did not happen (sbatch exit {proc.poll()}):\n{_output(proc)}")


def _output(proc) -> str:
    if proc.poll() is None:
        return ""
    return proc.stdout.read()[-4000:]


def test_sbatch_saves_requeues_on_the_time_limit_warning_and_the_requeued_job_resumes(tmp_path):
    bin_dir, stub = _stubs(tmp_path), tmp_path / "stub"
    stub.mkdir()
    job_id, port = _job_id_with_free_port()
    report, gate = tmp_path / "report", tmp_path / "gate"
    report.mkdir()
    gate.write_text("2")  # the tasks hold before step 3 until the test lets them go (or a signal arrives)
    opt = write_opt(tmp_path, train={"total_iter": 6}, datasets={"train": {"dataloader_batch_size": 4}})
    root = tmp_path / "experiments"
    env = base_env(str(report), PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", STUB_DIR=str(stub),
                   STUB_JOB_ID=job_id, STUB_NODELIST="127.0.0.[1-2]", STUB_ENTRY=DIST_ENTRY, TEST_STEP_GATE=str(gate))
    cmd = [os.path.join(bin_dir, "sbatch"), "--nodes=2", "--ntasks-per-node=2", "scripts/slurm_train.sh", opt,
           "--set", f"path.root={root}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = root / "tiny" / "train.log"
    try:
        # rank 0 waits at step 3: every rank has agreed not to stop at step 2
        _wait_for(lambda: held_step(gate) == 3, proc, 180, "the hold at step 3")
        os.kill(int((stub / "batch.pid").read_text()), signal.SIGUSR1)  # SLURM's --signal=B:USR1@300
        scontrol = stub / "scontrol.log"
        _wait_for(lambda: scontrol.is_file() and scontrol.read_text(), proc, 120, "scontrol requeue")
        gate.write_text("100")
        out = proc.communicate(timeout=180)[0]
    finally:
        kill_tree(proc)
    assert proc.returncode == 0, out[-4000:]
    directives = json.loads((stub / "directives.json").read_text())
    assert directives["signal"] == "B:USR1@300" and "requeue" in directives
    assert (stub / "scontrol.log").read_text() == f"requeue {job_id}\n"
    assert (stub / "jobs.log").read_text() == "run 0 exit 0\nrun 1 exit 0\n"  # stopped and requeued, then finished
    assert f"job {job_id} (restart 1): 4 task(s) on 127.0.0.[1-2]" in out
    text = log.read_text()
    assert "Stopped by SIGUSR1 at step 3: checkpoint saved" in text
    assert "Resuming from step 3" in text and "not bit-exact" not in text
    assert complete_steps(str(root / "tiny" / "models")) == [3, 6]
    reps = reports(str(report))
    assert [r["rank"] for r in reps] == [0, 1, 2, 3] and all(r["rc"] == 0 for r in reps)
    assert [r["cuda_visible_devices"] for r in reps] == ["0", "1", "0", "1"]  # one GPU id per task
    assert {r["world_size"] for r in reps} == {4}
    assert {(r["master_addr"], r["master_port"]) for r in reps} == {("127.0.0.1", str(port))}  # first host; job port
