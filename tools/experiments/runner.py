"""Running a grid: each run in its own folder ``work_dir/runs/<name>/`` (the bundle's ``output_dir``) with
``log.txt``, ``run.json`` (the exact commands, commit, GPU, wall time, status) and, once it has succeeded,
``result.json``. A run whose ``result.json`` exists is skipped, so running a grid again resumes it (an interrupted
bundle run resumes from its own last checkpoint). Fine-tunes wait for the pre-training they start from; up to
``jobs`` runs share the GPU(s), each on the least loaded GPU of ``gpus``.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

from bim.files import atomic_file

from .grid import Run
from .vocabulary import EARLY_STOP_EVAL_PREFIX, ROOT, TRAIN_CONFIG_OF_KIND, ExperimentError


def _git_commit() -> str:
    """HEAD, with ``+dirty`` when tracked files have uncommitted changes; ``unknown`` outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def bundle_version(kind: str) -> str | None:
    """The ``version`` in ``configs/metadata.json`` of the bundle that runs of ``kind`` train with, recorded with each
    run, so that a CSV shows which defaults a run had when a bundle's default changes; None for a kind
    without a bundle or a metadata file without one."""
    if kind not in TRAIN_CONFIG_OF_KIND:
        return None
    meta = (ROOT / TRAIN_CONFIG_OF_KIND[kind]).with_name("metadata.json")
    if not meta.is_file():
        return None
    try:
        return json.loads(meta.read_text()).get("version")
    except json.JSONDecodeError as e:
        raise ExperimentError(f"{meta}: not valid JSON ({e})") from None


def _gpu_name() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)
        names = [n.strip() for n in out.stdout.splitlines() if n.strip()]
        if out.returncode == 0 and names:
            return f"{len(names)} x {names[0]}" if len(names) > 1 else names[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return "cpu"


def atomic_write_json(obj, path: Path) -> None:
    """Write ``obj`` as JSON to ``path`` through a temporary file in the same folder and a rename."""
    with atomic_file(path) as tmp:
        Path(tmp).write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def run_dir(work_dir, run: Run) -> Path:
    return Path(work_dir).resolve() / "runs" / run.name


# where a run reads and writes, not what it does, and the stand-in of each in the results CSV (portable_command)
PATH_PLACEHOLDERS = {"--dataset_dir": "DATASET", "--output_dir": "RUN", "--pretrained": "INIT"}
PATH_ARGS = tuple(PATH_PLACEHOLDERS)


def settings_of(command) -> list[str]:
    """A bundle command (a string as ``run.json`` records it, or an argument list) without its interpreter and
    ``PATH_ARGS``: what makes two runs of one name the same run, wherever the data and the work dir live."""
    args = iter((shlex.split(command) if isinstance(command, str) else list(command))[1:])
    kept = []
    for a in args:
        if a in PATH_ARGS:
            next(args, None)  # and its value
        else:
            kept.append(a)
    return kept


def portable_command(command: str) -> str:
    """A bundle command as the results CSV records it: the interpreter as ``python`` and the value of each of
    ``PATH_ARGS`` as a placeholder, ``DATASET`` (the prepared data set), ``RUN`` (the run's folder, ``runs/<name>`` in
    the work dir) and ``INIT`` (the ``model.pt`` of the run in the ``init`` column; ``None`` stays), so that the CSV
    holds what a run did, not where it ran (the run's ``run.json`` keeps the exact command). Its
    :func:`settings_of` are the command's."""
    args = shlex.split(command)
    if args:
        args[0] = "python"
    for i, a in enumerate(args[:-1]):
        if a in PATH_PLACEHOLDERS and not (a == "--pretrained" and args[i + 1] == "None"):
            args[i + 1] = PATH_PLACEHOLDERS[a]
    return shlex.join(args)


def _flag_values(commands: list[list[str]]) -> dict[str, str]:
    """``{"cmd0 --flag": value}`` over several commands' arguments (a flag without a value maps to "")."""
    pairs = {}
    for i, args in enumerate(commands):
        for k, a in enumerate(args):
            if a.startswith("--"):
                nxt = args[k + 1] if k + 1 < len(args) and not args[k + 1].startswith("--") else ""
                pairs[f"{a}" if i == 0 else f"{a} (command {i + 1})"] = nxt
    return pairs


def check_finished_runs(grid: list[Run], work_dir) -> None:
    """A finished run is skipped by name, so a work dir that holds a run of the same name made with other settings
    (another preset, other overrides) would silently stand in for this grid's: refuse it, naming the run and the
    arguments that differ. Runs whose ``run.json`` recorded no commands are not checked."""
    clashes = []
    for r in grid:
        out = run_dir(work_dir, r)
        if not (out / "result.json").is_file() or not (out / "run.json").is_file():
            continue
        recorded = json.loads((out / "run.json").read_text()).get("commands")
        if recorded is None:
            continue
        old, new = [settings_of(c) for c in recorded], [settings_of(c) for c in r.commands]
        if old != new:
            o, n = _flag_values(old), _flag_values(new)
            diff = sorted(k for k in o.keys() | n.keys() if o.get(k) != n.get(k))
            clashes.append(f"{r.name} (recorded: {', '.join(f'{k} {o.get(k)}' for k in diff) or old}; "
                           f"this grid: {', '.join(f'{k} {n.get(k)}' for k in diff) or new})")
    if clashes:
        raise ExperimentError(f"{Path(work_dir).resolve()}: {len(clashes)} finished run(s) of this grid's names were "
                              f"made with other settings, e.g. {clashes[0]}. Use another --work_dir for another preset, "
                              "or a --tag for other overrides")


def result_of(run: Run, out: Path) -> dict:
    """What a finished run contributes to the results table (read from the files its bundle wrote)."""
    res = {"name": run.name, "kind": run.kind, **run.meta}
    if run.kind == "pretrain":
        if not (out / "model.pt").is_file():
            raise ExperimentError(f"{out}: the pre-training wrote no model.pt")
        panel = out / "panels" / "clusters_latest.png"  # relative to the work_dir (results.csv's folder)
        res["panel"] = panel.relative_to(out.parents[1]).as_posix() if panel.is_file() else ""
        quality = out / "cluster_quality.json"  # pretrain_bim's label-based score of the clusters, when labels exist
        if quality.is_file():
            q = json.loads(quality.read_text())
            res["cq_nmi"] = q["nmi"]
            for name, v in q["classes"].items():
                res[f"cq_{name}"], res[f"cq_{name}_per_scan"] = v["pooled_dice"], v["per_scan_dice"]
                for key in ("many_to_one_dice", "precision", "recall"):  # absent from pretrain_bim < 0.2.1
                    if key in v:
                        res[f"cq_{name}_{key.removesuffix('_dice')}"] = v[key]
                spill = list(v.get("spill", {}).values())  # pretrain_bim >= 0.5.5: nearest band first, farthest last
                if spill:
                    res[f"cq_{name}_spill_border"], res[f"cq_{name}_spill_far"] = spill[0], spill[-1]
            for name, v in q.get("center_crop", {}).get("classes", {}).items():  # pretrain_bim >= 0.5.4
                res[f"cq_{name}_centre"] = v["pooled_dice"]
            for name in q["classes"] if q.get("subheads") else ():  # the mean over the independent sub-heads
                res[f"cq_{name}_subheads"] = sum(h["classes"][name]["pooled_dice"] for h in q["subheads"]) / len(q["subheads"])
        return res
    summaries = test_evaluations(out, "_summary.json")
    best = out / "best_metric.json"
    if not summaries or not best.is_file():
        raise ExperimentError(f"{out}: expected eval/*_summary.json and best_metric.json after training + evaluation")
    summary, best = json.loads(summaries[-1].read_text()), json.loads(best.read_text())
    res.update(test_dice=summary["mean"], test_dice_std_scans=summary["std"], test_scans=summary["n"],
               val_dice=best["value"], best_epoch=best["epoch"])
    res.update(early_stop_result(out))
    return res


def test_evaluations(out: Path, suffix: str) -> list[Path]:
    """A run's test-set evaluation files ``eval/*<suffix>`` of its best-validation model, sorted (those of its
    early-stopping record's model left out)."""
    return sorted(p for p in (out / "eval").glob(f"*{suffix}") if not p.name.startswith(EARLY_STOP_EVAL_PREFIX))


def early_stop_result(out: Path) -> dict:
    """What a run with ``--record_early_stop`` adds (none without ``early_stop_record.json``), for each recorded
    patience N: ``es{N}_stopped`` (whether early stopping would have ended it), ``es{N}_epoch`` (where),
    ``es{N}_best_epoch``, the shares of the run's epochs and seconds up to there (``es{N}_epoch_share``;
    ``es{N}_time_share``, None when the run was resumed after that point) and ``es{N}_test_dice``, the test Dice of
    the model early stopping with patience N would have kept."""
    path = out / "early_stop_record.json"
    if not path.is_file():
        return {}
    records = json.loads(path.read_text())
    result = {}
    for rec in [records] if isinstance(records, dict) else records:
        summary = out / "eval" / f"{EARLY_STOP_EVAL_PREFIX}{rec['patience']}_summary.json"
        if not summary.is_file() or "run_epochs" not in rec:
            raise ExperimentError(f"{out}: early_stop_record.json without the run's end or {summary.name}: run again")
        es = f"es{rec['patience']}_"
        result.update({es + "stopped": rec["stopped"], es + "epoch": rec["epoch"], es + "best_epoch": rec["best_epoch"],
                       es + "epoch_share": rec["epoch"] / rec["run_epochs"],
                       es + "time_share": rec["seconds"] / rec["run_seconds"] if rec["run_seconds"] else None,
                       es + "test_dice": json.loads(summary.read_text())["mean"]})
    return result


_CHILDREN: set[subprocess.Popen] = set()  # the bundle processes running now (stopped with the runner)
_CHILDREN_LOCK = threading.Lock()
_STOPPING = threading.Event()  # set by stop_children: no bundle command starts any more


def _run_child(cmd, log, env) -> int:
    """Run one bundle command to its end and return its exit code; :func:`stop_children` can stop it."""
    with _CHILDREN_LOCK:
        if _STOPPING.is_set():
            return -signal.SIGTERM
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
        _CHILDREN.add(proc)
    try:
        return proc.wait()
    finally:
        with _CHILDREN_LOCK:
            _CHILDREN.discard(proc)


def stop_children(grace_s: float = 20.0) -> None:
    """SIGTERM every running bundle process, then SIGKILL those still alive after ``grace_s`` seconds. A stopped
    run is recorded as failed; its next attempt resumes from its last checkpoint."""
    with _CHILDREN_LOCK:
        _STOPPING.set()
        procs = list(_CHILDREN)
    for proc in procs:
        proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()


def execute(run: Run, work_dir, env: dict | None = None) -> dict:
    """Run the commands of ``run`` (logging to ``log.txt``), then write ``run.json`` and ``result.json``."""
    out = run_dir(work_dir, run)
    out.mkdir(parents=True, exist_ok=True)
    # an interrupted earlier attempt (its bundle resumes from its checkpoints): wall_s counts this attempt only,
    # wall_s_all_attempts adds the earlier ones (None when one of them was killed before it could record its time)
    previous = json.loads((out / "run.json").read_text()) if (out / "run.json").is_file() else {}
    record = {"name": run.name, "kind": run.kind, "meta": run.meta, "commands": [shlex.join(c) for c in run.commands],
              "commit": _git_commit(), "bundle_version": bundle_version(run.kind), "gpu": _gpu_name(),
              "host": os.uname().nodename, "status": "running",
              "cuda_visible_devices": (env or os.environ).get("CUDA_VISIBLE_DEVICES"),
              "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "attempt": int(previous.get("attempt", 0)) + 1,
              "earlier_attempts_started": previous.get("earlier_attempts_started", []) + (
                  [previous["started"]] if "started" in previous else []),
              "earlier_attempts_wall_s": previous.get("earlier_attempts_wall_s", []) + (
                  [previous.get("wall_s")] if "started" in previous else [])}
    atomic_write_json(record, out / "run.json")
    start = time.perf_counter()
    with open(out / "log.txt", "a") as log:
        for cmd in run.commands:
            log.write(f"+ {shlex.join(cmd)}\n")
            log.flush()
            rc = _run_child(cmd, log, env)
            if rc != 0:
                record.update(status="failed", returncode=rc, wall_s=round(time.perf_counter() - start, 1))
                atomic_write_json(record, out / "run.json")
                raise ExperimentError(f"run {run.name} failed (exit {rc}); see {out / 'log.txt'}")
    record.update(status="done", wall_s=round(time.perf_counter() - start, 1))
    earlier = record["earlier_attempts_wall_s"]
    record["wall_s_all_attempts"] = None if None in earlier else round(record["wall_s"] + sum(earlier), 1)
    result = {**result_of(run, out), "wall_s": record["wall_s"], "wall_s_all_attempts": record["wall_s_all_attempts"],
              "attempt": record["attempt"],
              "commit": record["commit"], "bundle_version": record["bundle_version"], "gpu": record["gpu"],
              "command": record["commands"][0]}
    atomic_write_json(record, out / "run.json")
    atomic_write_json(result, out / "result.json")
    return result


# GPU load of a run when placing it on one of several GPUs: a pre-training step processes ~7x the images of a
# fine-tuning step (36 vs 5), a Mean Teacher step ~3x (student labelled + unlabelled, teacher)
RUN_LOAD = {"pretrain": 3, "meanteacher": 2, "finetune": 1}


def parse_gpus(gpus) -> list[str]:
    """``--gpus``: None (every run sees what the environment gives), a count (``2``: GPUs 0 and 1) or a list of
    device ids (``0,1`` / ``[0, 1]``). Ids count within the parent's ``CUDA_VISIBLE_DEVICES`` when that is set
    (see :func:`visible_device`), so ``CUDA_VISIBLE_DEVICES=1 ... --gpus 1`` runs everything on physical GPU 1."""
    if gpus in (None, "", "None"):
        return []
    if isinstance(gpus, int) and not isinstance(gpus, bool):
        if gpus < 1:
            raise ExperimentError(f"gpus must be >= 1 (a count) or a list of device ids, got {gpus}")
        return [str(i) for i in range(gpus)]
    ids = [str(g).strip() for g in (gpus.split(",") if isinstance(gpus, str) else gpus) if str(g).strip()]
    if not ids or len(set(ids)) != len(ids) or not all(i.isdigit() for i in ids):
        raise ExperimentError(f"gpus must be a count or distinct device ids such as 0,1; got {gpus!r}")
    return ids


def visible_device(gpu: str, env: dict) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` value for the runner's GPU id ``gpu``: the id itself, or, when the parent
    environment already restricts the devices, the ``gpu``-th entry of that list (as CUDA numbers them)."""
    parent = [d.strip() for d in (env.get("CUDA_VISIBLE_DEVICES") or "").split(",") if d.strip()]
    if not parent:
        return gpu
    if int(gpu) >= len(parent):
        raise ExperimentError(f"gpus: id {gpu} is out of range for CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']!r} "
                              f"({len(parent)} device(s), ids 0..{len(parent) - 1})")
    return parent[int(gpu)]


def pick_gpu(gpus: list[str], running: list[tuple[str, str]]) -> str:
    """The GPU of ``gpus`` with the least load (``RUN_LOAD``) among the ``running`` (gpu, kind) pairs; ties go to
    the first listed."""
    load = {g: 0 for g in gpus}
    for g, kind in running:
        if g in load:
            load[g] += RUN_LOAD.get(kind, 1)
    return min(gpus, key=lambda g: load[g])


def _start(r: Run, work_dir, env: dict, gpus: list[str], running: dict, pool, placed: dict, log) -> None:
    """Submit ``r`` to ``pool``, on the least loaded of ``gpus`` (when given)."""
    run_env = env
    if gpus:
        placed[r.name] = pick_gpu(gpus, [(placed[x.name], x.kind) for x in running.values()])
        run_env = {**env, "CUDA_VISIBLE_DEVICES": visible_device(placed[r.name], env)}
    log(f"start {r.name}" + (f" on GPU {placed[r.name]}" if gpus else ""))
    running[pool.submit(execute, r, work_dir, run_env)] = r


def _finish(finished, running: dict, done: set, failed: set, counts: dict, log, t0: float) -> None:
    """Book the ``finished`` futures: done (with its test Dice) or failed."""
    for fut in finished:
        r = running.pop(fut)
        try:
            res = fut.result()
        except ExperimentError as e:
            failed.add(r.name)
            counts["failed"] += 1
            log(f"FAILED {e}")
            continue
        done.add(r.name)
        counts["done"] += 1
        dice = f", test Dice {res['test_dice']:.4f}" if "test_dice" in res else ""
        log(f"done {r.name} in {res['wall_s']:.0f} s{dice} [{time.perf_counter() - t0:.0f} s]")


def _stop_on_sigterm(running: dict, log):
    """A SIGTERM handler that stops the running bundles with the runner (``timeout`` or ``kill``), never orphaning
    them; it acts once (GNU timeout signals the runner and then its whole process group)."""
    def on_sigterm(signum, frame):
        if _STOPPING.is_set():
            return
        _STOPPING.set()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM (timeout's to the group) cannot cut the stop short
        log(f"signal {signum}: stopping {len(running)} running run(s)")
        stop_children()
        raise SystemExit(128 + signum)
    return on_sigterm


def run_grid(grid: list[Run], work_dir, jobs: int = 1, log=print, gpus=None) -> dict:
    """Execute ``grid`` with up to ``jobs`` concurrent runs; runs with a ``result.json`` are skipped, a run waits
    for its pre-training, a failed pre-training skips its dependants. With ``gpus`` (see :func:`parse_gpus`) each
    run is started on the least loaded of those GPUs (``CUDA_VISIBLE_DEVICES``). Returns counts per outcome."""
    if jobs < 1:
        raise ExperimentError(f"jobs must be >= 1, got {jobs}")
    gpus, env = parse_gpus(gpus), dict(os.environ)
    for g in gpus:  # an id outside the parent's CUDA_VISIBLE_DEVICES fails before anything runs
        visible_device(g, env)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // jobs)))
    check_finished_runs(grid, work_dir)
    done = {r.name for r in grid if (run_dir(work_dir, r) / "result.json").is_file()}
    counts = {"skipped_existing": len(done), "done": 0, "failed": 0, "skipped_dependency": 0}
    pending, failed, running, placed = [r for r in grid if r.name not in done], set(), {}, {}
    t0 = time.perf_counter()
    _STOPPING.clear()
    in_main = threading.current_thread() is threading.main_thread()
    previous_handler = signal.signal(signal.SIGTERM, _stop_on_sigterm(running, log)) if in_main else None
    try:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            while pending or running:
                for r in list(pending):
                    if any(d in failed for d in r.depends):
                        pending.remove(r)
                        failed.add(r.name)
                        counts["skipped_dependency"] += 1
                        log(f"skip {r.name}: its pre-training failed")
                    elif len(running) < jobs and all(d in done for d in r.depends):
                        pending.remove(r)
                        _start(r, work_dir, env, gpus, running, pool, placed, log)
                if not running:
                    if pending:
                        raise ExperimentError(f"runs wait on pre-trainings outside the grid: {[r.name for r in pending]}")
                    break
                finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
                _finish(finished, running, done, failed, counts, log, t0)
    finally:
        if in_main and not _STOPPING.is_set():  # once stopping, SIGTERM stays ignored until the runner exits
            signal.signal(signal.SIGTERM, previous_handler)
    counts["wall_s"] = round(time.perf_counter() - t0, 1)
    return counts
