"""Growing and shrinking: a run continued on another number of processes (real processes, tiny VRT at 2 intra-op
threads), and torchrun's elastic membership (real agents with a c10d rendezvous on the loopback address, which leave
and join; the toy network, as the agents are what is tested).

Every run here is compared with an uninterrupted 2-process run: the same items at every step (epoch ends
included), the same LR, loss and step count, and the same weights, EMA and optimizer state. The bound on the weights
is 0 (bit-identical), measured and expected: with one clip per process, 2 processes average two gradients in DDP,
``(g0 + g1) / 2``, and 1 process accumulates two micro-batches, ``g0 / 2 + g1 / 2``; halving is exact in binary
floating point and a sum of two terms has one order, so both give the same bits (measured: max |diff| 0 for G, E and
the Adam moments after 12 steps). Stochastic depth is off here: its per-rank random streams follow the number of
processes (docs/clusters.md), which changes the numbers by design.
"""

from __future__ import annotations

import copy
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from tests.support.helpers import (
    DIST_ENTRY,
    ROOT,
    TINY_OPT,
    VRT_TINY_OPT,
    assert_ok,
    base_env,
    free_port,
    held_step,
    kill_tree,
    models_dir,
    run_state,
    single,
    torchrun,
    write_opt,
)
from utils.utils_checkpoint import complete_steps
from utils.utils_dataloader import BatchSplitError

ELASTIC_OPT = copy.deepcopy(VRT_TINY_OPT)
ELASTIC_OPT["netG"]["drop_path_rate"] = 0.0
ELASTIC_OPT["train"].update(total_iter=12, checkpoint_save=4, grad_accum_steps="auto")
ELASTIC_OPT["datasets"]["train"].update(dataloader_batch_size=2, dataloader_num_workers=0)  # 7 clips: 3 steps/epoch
# The membership test exercises torchrun's agents, not the network: the toy network (EMA on) keeps it short.
TOY_ELASTIC_OPT = copy.deepcopy(TINY_OPT)
TOY_ELASTIC_OPT["train"].update(total_iter=12, checkpoint_save=4, grad_accum_steps="auto", E_decay=0.9)
TOY_ELASTIC_OPT["datasets"]["train"].update(num_clips=7, dataloader_batch_size=2)
LOG_RE = re.compile(r"<epoch:\s*(\d+), iter:\s+([\d,]+), lr:(\S+)> G_loss: (\S+)")


def _log(tmp_path, task) -> str:
    with open(os.path.join(tmp_path, "experiments", task, "train.log")) as f:
        return f.read()


def _steps(tmp_path, task) -> dict[int, tuple[str, str, str]]:
    """(epoch, lr, loss) as logged for each step (the last time the step ran)."""
    return {int(m.group(2).replace(",", "")): (m.group(1), m.group(3), m.group(4))
            for m in LOG_RE.finditer(_log(tmp_path, task))}


def _items(report_dir) -> dict[int, list[tuple]]:
    """The items (key, sum of L, sum of H) each step trained on, over all ranks, from its last execution."""
    records: dict[int, list[dict]] = {}
    for path in glob.glob(os.path.join(report_dir, "items-*.jsonl")):
        with open(path) as f:
            for line in f:
                record = json.loads(line)
                records.setdefault(record["step"], []).append(record)
    out = {}
    for step, recs in records.items():
        recs.sort(key=lambda r: r["t"])
        last = recs[-recs[-1]["world"]:]  # the ranks of the attempt that ran it last
        assert sorted(r["rank"] for r in last) == list(range(recs[-1]["world"])), (step, last)
        out[step] = sorted(tuple(item) for r in last for item in r["items"])
    return out


def assert_same_as_reference(ref, tmp_path, task, report_dir):
    ref_path, ref_report = ref
    assert complete_steps(models_dir(tmp_path, task))[-1] == 12
    assert _steps(tmp_path, task) == _steps(ref_path, "ref")  # epochs, LR and loss of every step
    items, ref_items = _items(report_dir), _items(ref_report)
    assert sorted(items) == list(range(1, 13)) and items == ref_items
    a, b = run_state(ref_path, "ref", 12), run_state(tmp_path, task, 12)
    assert "E" in a and a.keys() == b.keys() and all(a[part].keys() == b[part].keys() for part in a)
    worst = max(float((a[p][k].double() - b[p][k].double()).abs().max()) for p in a for k in a[p])
    assert worst == 0.0, f"max |diff| {worst:.3g} from the uninterrupted run (bound 0: see the module docstring)"


def _run(tmp_path, opt, task, nproc, report_dir, *sets, threads=2):
    args = ["--opt", opt, "--set", f"task={task}", f"path.root={tmp_path / 'experiments'}", *sets]
    env = base_env(str(report_dir), threads=threads, TEST_LOG_ITEMS="1")
    if nproc > 1:  # generous limits: these only end a hang, and a loaded 2-core machine runs VRT slowly
        return torchrun(nproc, args, env, str(tmp_path), timeout=600)
    return single(args, env, str(tmp_path), timeout=600)


def _reference(tmp_path, base, threads):
    """An uninterrupted 12-step run on 2 processes (checkpoints at 4, 8 and 12)."""
    report = tmp_path / "report"
    report.mkdir()
    opt = write_opt(tmp_path, base=base)
    assert_ok(_run(tmp_path, opt, "ref", 2, report, threads=threads))
    assert "Global batch 2 = 1 per process x 2 process(es) x 1 accumulation step(s)" in _log(tmp_path, "ref")
    return tmp_path, str(report)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return _reference(tmp_path_factory.mktemp("vrt_ref"), ELASTIC_OPT, threads=2)


@pytest.fixture(scope="module")
def toy_reference(tmp_path_factory):
    return _reference(tmp_path_factory.mktemp("toy_ref"), TOY_ELASTIC_OPT, threads=1)


# ----------------------------------------------------------------------------------------------------------------
# another number of processes: 2 processes to step 4, 1 process to 8, 2 again to 12
# ----------------------------------------------------------------------------------------------------------------
def test_a_run_continues_on_another_number_of_processes_exactly(reference, tmp_path):
    report = tmp_path / "report"
    report.mkdir()
    opt = write_opt(tmp_path, base=ELASTIC_OPT)
    for nproc, total in ((2, 4), (1, 8), (2, 12)):
        assert_ok(_run(tmp_path, opt, "part", nproc, report, f"train.total_iter={total}"))
    log = _log(tmp_path, "part")
    assert "2 -> 1 processes: grad_accum_steps 1 -> 2, per-process batch 1 kept" in log
    assert "Global batch 2 = 1 per process x 1 process(es) x 2 accumulation step(s)" in log
    assert "1 -> 2 processes: grad_accum_steps 2 -> 1, per-process batch 1 kept" in log
    assert complete_steps(models_dir(tmp_path, "part")) == [4, 8, 12]
    assert_same_as_reference(reference, tmp_path, "part", str(report))


# ----------------------------------------------------------------------------------------------------------------
# elastic membership: two agents (--nnodes=1:2, c10d); one is killed, the survivor continues alone; a new one joins
# ----------------------------------------------------------------------------------------------------------------
LAUNCH = os.path.join(ROOT, "launch_train.sh")


def launch_command(tmp_path, args: list[str], **env: str) -> list[str]:
    """The command ``bash launch_train.sh ARGS`` runs (a stub ``python`` first on PATH prints it)."""
    stub_dir = tmp_path / "stub_python"
    stub_dir.mkdir(exist_ok=True)
    stub = stub_dir / "python"
    stub.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    stub.chmod(0o755)
    environment = base_env(PATH=f"{stub_dir}{os.pathsep}{os.environ['PATH']}", **env)
    proc = subprocess.run(["bash", LAUNCH, *args], env=environment, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_launch_train_passes_the_elastic_flags_to_torchrun(tmp_path):
    flags = ["--nnodes=1:4", "--rdzv-backend", "c10d", "--rdzv-endpoint=node0:29400", "--rdzv-id", "job7",
             "--rdzv-conf=join_timeout=600,last_call_timeout=30", "--max-restarts=10", "--monitor-interval", "2"]
    cmd = launch_command(tmp_path, [*flags, "opt.json", "--set", "train.total_iter=9"], NPROC="8")
    assert cmd == ["-m", "utils.utils_launch", "--nproc_per_node=8", "--nnodes=1:4", "--rdzv-backend=c10d",
                   "--rdzv-endpoint=node0:29400", "--rdzv-id=job7", "--rdzv-conf=join_timeout=600,last_call_timeout=30",
                   "--max-restarts=10", "--monitor-interval=2", "main_train_vrt.py", "--opt", "opt.json", "--set",
                   "train.total_iter=9"]
    # without rendezvous flags: one node (--standalone), or a static multi-node rendezvous from NNODES & co.
    assert launch_command(tmp_path, ["opt.json"], NPROC="2")[:4] == ["-m", "utils.utils_launch", "--standalone",
                                                                     "--nproc_per_node=2"]
    static = launch_command(tmp_path, ["opt.json"], NPROC="4", NNODES="2", NODE_RANK="1", MASTER_ADDR="n0")
    assert static[2:7] == ["--nnodes=2", "--node_rank=1", "--master_addr=n0", "--master_port=29500",
                           "--nproc_per_node=4"]


def test_the_launcher_keeps_torchruns_shared_store_away_from_joinable_rendezvous(monkeypatch):
    """The workaround for torch's shared rendezvous store (an agent joining later waits for an address nobody
    publishes): on for c10d rendezvous between agents, off where no agent joins later."""
    from utils.utils_launch import joinable_rendezvous

    for key in ("PET_RDZV_BACKEND", "PET_STANDALONE", "PET_NNODES"):
        monkeypatch.delenv(key, raising=False)
    assert joinable_rendezvous(["--nnodes=1:2", "--rdzv-backend=c10d", "--rdzv-endpoint=h:29400", "x.py", "--a"])
    assert not joinable_rendezvous(["--standalone", "--nproc_per_node=2", "x.py"])
    assert not joinable_rendezvous(["--nnodes=2", "--node_rank=1", "--master_addr=h", "x.py"])  # static
    monkeypatch.setenv("PET_RDZV_BACKEND", "c10d")  # a Kubeflow job or TorchX
    assert joinable_rendezvous(["x.py"])


def _kubeflow_pet_env(job: dict) -> dict[str, str]:
    """The PET_* variables the Kubeflow training operator (kubeflow.org/v1) sets on a PyTorchJob's pods with an
    elasticPolicy (pkg/controller.v1/pytorch/elastic.go)."""
    policy, worker = job["spec"]["elasticPolicy"], job["spec"]["pytorchReplicaSpecs"]["Worker"]
    container = next(c for c in worker["template"]["spec"]["containers"] if c["name"] == "pytorch")
    port = next(p["containerPort"] for p in container["ports"] if p["name"] == "pytorchjob-port")
    return {"PET_RDZV_ENDPOINT": f"{job['metadata']['name']}-worker-0:{port}",
            "PET_RDZV_BACKEND": policy["rdzvBackend"], "PET_NNODES": f"{policy['minReplicas']}:{policy['maxReplicas']}",
            "PET_MAX_RESTARTS": str(policy["maxRestarts"]), "PET_NPROC_PER_NODE": str(job["spec"]["nprocPerNode"])}


def test_the_kubeflow_job_reaches_torchrun_through_its_pet_variables(tmp_path, monkeypatch):
    """scripts/k8s/pytorchjob.yaml: the operator's PET_* variables choose the rendezvous (launch_train.sh adds no flag
    over them), torchrun reads them as its defaults, and the checkpoints go to the shared volume."""
    yaml = pytest.importorskip("yaml")
    from torch.distributed.run import config_from_args, get_args_parser

    with open(os.path.join(ROOT, "scripts", "k8s", "pytorchjob.yaml")) as f:
        job = yaml.safe_load(f)
    pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    container = next(c for c in pod["containers"] if c["name"] == "pytorch")
    assert container["command"][:2] == ["bash", "launch_train.sh"]
    assert os.path.isfile(os.path.join(ROOT, container["command"][2]))  # a published recipe of ours
    pet = _kubeflow_pet_env(job)
    cmd = launch_command(tmp_path, [*container["command"][2:], *container["args"]], **pet)
    assert cmd[:3] == ["-m", "utils.utils_launch", "main_train_vrt.py"]
    for key, value in pet.items():
        monkeypatch.setenv(key, value)
    config, _, entry_args = config_from_args(get_args_parser().parse_args(cmd[2:]))
    assert (config.min_nodes, config.max_nodes, config.nproc_per_node, config.max_restarts) == (1, 4, 8, 100)
    assert (config.rdzv_backend, config.rdzv_endpoint) == ("c10d", "vrt-reds-worker-0:23456")
    assert "train.grad_accum_steps=auto" in entry_args
    root = next(a.split("=", 1)[1] for a in entry_args if a.startswith("path.root="))
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == root)
    claim = next(v for v in pod["volumes"] if v["name"] == mount["name"])["persistentVolumeClaim"]["claimName"]
    assert claim == "vrt-experiments" and not mount.get("readOnly")


def _agent(cmd, env, out_path):
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=open(out_path, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _wait(predicate, what, agents, timeout=600):
    """Until ``predicate()``; fails at once if agent A (which stays up throughout) has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and agents["A"][0].poll() is None:
        if predicate():
            return
        time.sleep(0.1)
    tails = {name: open(path).read()[-3000:] for name, (_, path) in agents.items()}
    raise AssertionError(f"{what} did not happen (agent A exit {agents['A'][0].poll()}); agents' output: {tails}")


def test_elastic_agents_leave_and_join_and_the_run_ends_as_an_uninterrupted_one(toy_reference, tmp_path):
    """Agents A and B train steps 1-5 on 2 processes; B's node dies (SIGKILL of its agent and worker); A's group
    restarts with 1 process from step 4 (grad_accum_steps 1 -> 2) and trains to 7; agent C joins; A stops its worker
    (SIGTERM: it saves step 8) and the group restarts on 2 processes from step 8 up to 12."""
    report, gate = tmp_path / "report", tmp_path / "gate"
    report.mkdir()
    gate.write_text("5")  # the workers hold before any step above the number in this file (or until a SIGTERM)
    opt = write_opt(tmp_path, base=TOY_ELASTIC_OPT)
    port = free_port()
    # short timeouts, but a heartbeat that a loaded machine keeps up with: a node counts as dead after 5 s without one
    conf = "join_timeout=300,last_call_timeout=5,keep_alive_interval=1,keep_alive_max_attempt=5"
    flags = ["--nnodes=1:2", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=elastic",
             "--max-restarts=3", "--monitor-interval=0.5", f"--rdzv-conf={conf}"]
    args = [*flags, opt, "--set", "task=elastic", f"path.root={tmp_path / 'experiments'}"]
    launched = launch_command(tmp_path, args, NPROC="1")
    env = base_env(str(report), TEST_LOG_ITEMS="1", TEST_STEP_GATE=str(gate), LOGLEVEL="INFO")
    agents: dict[str, tuple[subprocess.Popen, str]] = {}

    def start(name):
        # agent A hosts the rendezvous store (on a cluster: the endpoint's node, which must stay up)
        host = f"--rdzv-conf={conf},is_host={int(name == 'A')}"
        cmd = [sys.executable, *[DIST_ENTRY if a == "main_train_vrt.py" else host if a.startswith("--rdzv-conf")
                                 else a for a in launched]]
        path = str(tmp_path / f"agent_{name}.out")
        agents[name] = (_agent(cmd, env, path), path)

    def logged(text):
        log = tmp_path / "experiments" / "elastic" / "train.log"
        return log.is_file() and text in log.read_text()

    try:
        start("A")
        start("B")
        _wait(lambda: logged("iter:       5,"), "steps 1-5 on 2 processes", agents)
        assert logged("x 2 process(es)") and not logged("x 1 process(es)"), "A and B did not form one group"
        kill_tree(agents["B"][0])
        gate.write_text("7")
        # the worker waits at step 8, past step 7's stop agreement
        _wait(lambda: logged("2 -> 1 processes") and held_step(gate) == 8, "steps 5-7 on 1 process", agents)
        start("C")
        _wait(lambda: logged("1 -> 2 processes"), "the restart on 2 processes", agents)
        gate.write_text("12")
        for name in ("A", "C"):
            agents[name][0].wait(timeout=600)
    finally:
        for proc, _ in agents.values():
            kill_tree(proc)
    for name in ("A", "C"):
        assert agents[name][0].returncode == 0, open(agents[name][1]).read()[-4000:]
    log = _log(tmp_path, "elastic")
    assert "Resuming from step 4" in log and "Resuming from step 8" in log
    assert "2 -> 1 processes: grad_accum_steps 1 -> 2, per-process batch 1 kept" in log
    assert "Stopped by SIGTERM at step 8: checkpoint saved" in log  # the membership change
    assert "1 -> 2 processes: grad_accum_steps 2 -> 1, per-process batch 1 kept" in log
    assert_same_as_reference(toy_reference, tmp_path, "elastic", str(report))


# ----------------------------------------------------------------------------------------------------------------
# the decisions, unit by unit
# ----------------------------------------------------------------------------------------------------------------
def test_grad_accum_auto_keeps_the_per_process_batch_of_the_checkpoint():
    from engine.resume import resolve_grad_accum

    saved = {"world_size": 8, "per_process_batch": 1, "grad_accum_steps": 1}
    assert resolve_grad_accum("auto", None, 2, 8) == (1, None)  # a new run
    assert resolve_grad_accum("auto", saved, 8, 8) == (1, None)  # the same number of processes
    assert resolve_grad_accum("auto", saved, 4, 8) == (2, "8 -> 4 processes: grad_accum_steps 1 -> 2, per-process "
                                                          "batch 1 kept")
    accum, line = resolve_grad_accum(1, saved, 4, 8)  # a fixed value keeps the accumulation, not the memory
    assert accum == 1 and line == ("8 -> 4 processes: grad_accum_steps 1 kept, per-process batch 1 -> 2 "
                                   "(train.grad_accum_steps='auto' keeps the per-process batch)")
    assert resolve_grad_accum("auto", saved, 4, 16)[1] == ("8 -> 4 processes: grad_accum_steps 1 -> 4, per-process "
                                                           "batch 1 kept, global batch 8 -> 16")
    with pytest.raises(BatchSplitError, match=r"keeps the checkpoint's per-process batch of 1, but the global batch 8 "
                       r"is not a multiple of 1 x 3 process\(es\); run 1 / 2 / 4 / 8 processes to keep it$"):
        resolve_grad_accum("auto", saved, 3, 8)
    with pytest.raises(BatchSplitError, match=r"run 1 / 3 processes to keep it, or set train.grad_accum_steps to "
                       r"one of 1 \(per-process batch 6\), 2 \(per-process batch 3\), 3 \(per-process batch 2\), 6"):
        resolve_grad_accum("auto", {**saved, "per_process_batch": 4}, 2, 12)


def test_grad_accum_option_accepts_a_number_or_auto(tmp_path):
    from engine.options import parse_options
    from utils.utils_option import OptionError

    opt = write_opt(tmp_path, base=TINY_OPT)
    assert parse_options(opt, ["train.grad_accum_steps=auto"])["train"]["grad_accum_steps"] == "auto"
    assert parse_options(opt, ["train.grad_accum_steps=3"])["train"]["grad_accum_steps"] == 3
    for bad in ("0", "some"):
        with pytest.raises(OptionError, match=r"'train.grad_accum_steps' = .*: must be >= 1 or \"auto\""):
            parse_options(opt, [f"train.grad_accum_steps={bad}"])


def test_a_rank_that_cannot_see_the_checkpoint_is_a_clear_error(toy_reference, tmp_path):
    """Rank 0 writes the checkpoints and every rank reads them: experiments/ on a disk of rank 0's node only is
    reported by name on every rank instead of failing later on a missing file."""
    ref_path, _ = toy_reference
    shutil.copytree(os.path.join(ref_path, "experiments", "ref"), os.path.join(tmp_path, "experiments", "ref"))
    opt = write_opt(tmp_path, base=TOY_ELASTIC_OPT)
    args = ["--opt", opt, "--set", "task=ref", f"path.root={tmp_path / 'experiments'}", "train.total_iter=14"]
    proc = torchrun(2, args, base_env(TEST_HIDE_STATE_RANK="1"), str(tmp_path))
    assert proc.returncode != 0
    assert re.search(r"error: rank 1 \(\S+\) cannot see \S+/12_state\.pth, which rank 0 found: rank 0 writes the "
                     r"checkpoints and every rank reads them, so path\.root must be on storage that every node shares",
                     proc.stderr), proc.stderr[-3000:]
    assert complete_steps(models_dir(tmp_path, "ref")) == [4, 8, 12]  # nothing trained, nothing written
