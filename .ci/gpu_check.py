"""Every GPU check of gpuviz in one command, made to fit a short lease of a one-GPU machine.

    python .ci/gpu_check.py prepare [--wheels .gpu-wheels]      # here, with network
    python .ci/gpu_check.py run [--out PATH] [--budget 540]     # there: no network
    python .ci/gpu_check.py run --dry-run [--out PATH]          # anywhere: the simulated device

``prepare`` downloads, for CPython 3.12 on x86-64 Linux, every wheel that gpuviz and these checks
need and the GPU machine lacks (``PRESENT`` is what its image holds) into ``.gpu-wheels/``
(ignored by git; carried to the machine with the working tree), and checks that the working tree
and the wheels together stay within the 64 MiB a lease carries.

``run`` builds and installs gpuviz from this working tree (``pip install --no-index --find-links
.gpu-wheels .``), then runs each step in a fresh process (``.ci/gpu_steps.py``): the
``gpu``-marked tests, a real PyTorch snapshot opened in gpuviz, PyTorch on gpuviz's BFC through
the pluggable allocator, CuPy on gpuviz's BFC checked against NVML, CUPTI transfers. The results
go to one JSON file (``$OUT/gpu-check.json`` where ``$OUT`` is set, else ``gpu-check.json``),
rewritten after every step, in the schema of ``benchmarks/_results.py`` (plus ``steps``), so that
``benchmarks/write_results.py`` renders it as RESULTS.md's GPU section. Exit status 0 when every
step is ``ok`` (``simulated`` with ``--dry-run``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STEPS = Path(__file__).resolve().parent / "gpu_steps.py"
LIMIT = 64 * 2**20  # what a lease carries: the working tree and the wheels together
# the GPU machine's image (Python 3.12; normalized names): gpuviz's needs beyond these travel as wheels
PRESENT = set(
    """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
    certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
    cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
    flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
    huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt
    jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities
    linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes
    mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba
    numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
    nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse
    nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx
    onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
    orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client
    propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions
    pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
    pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
    scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
    sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl
    tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics
    torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop
    wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp""".split()  # noqa: SIM905
)
# for the checks, installed without their dependencies: CUPTI's Python bindings for CUDA 13.0
# (PyTorch's CUDA 13.0 build brings CUPTI 13.0), and what they need that the image lacks
CHECK_WHEELS = ["cupti-python~=13.0.0", "pyelftools"]
TARGET = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "extra": "",
}
PLATFORMS = [
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
    "linux_x86_64",
]
# (step, seconds it may take at most; the run's budget cuts it shorter)
PLAN = [
    ("environment", 90),
    ("install", 300),
    ("gpu-tests", 300),
    ("torch-snapshot", 150),
    ("torch-bfc", 150),
    ("cupy-bfc", 150),
    ("cupti-transfers", 150),
]


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _toml(path: Path) -> dict[str, Any]:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        from pip._vendor import tomli as tomllib
    with open(path, "rb") as file:
        data: dict[str, Any] = tomllib.load(file)
    return data


# ------------------------------------------------------------------ prepare (here, with network)
def tree_bytes() -> int:
    """Bytes of what a lease copies: tracked files and untracked files git does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    return sum(
        (ROOT / os.fsdecode(name)).stat().st_size for name in listed if name and (ROOT / os.fsdecode(name)).is_file()
    )


def _download(requirements: list[str], folder: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        "--implementation",
        "cp",
        "--abi",
        "cp312",
        "--abi",
        "abi3",
        "--abi",
        "none",
        "-d",
        str(folder),
    ]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    done = subprocess.run([*command, *requirements], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"gpu-check prepare: pip download {' '.join(requirements)} failed:\n{done.stderr[-3000:]}")


def _requires(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        text = archive.read(name).decode("utf-8")
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def _wheel_name(wheel: Path) -> str:
    return _normal(wheel.name.split("-")[0])


def prepare(folder: Path) -> None:
    """Download every wheel gpuviz and the checks need that the GPU machine lacks, then check the size."""
    from packaging.requirements import Requirement

    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.whl"):
        old.unlink()
    project = _toml(ROOT / "pyproject.toml")
    build = list(project["build-system"]["requires"])  # pip's isolated build takes these from the wheels only
    wanted = list(project["project"]["dependencies"]) + CHECK_WHEELS
    fetched: set[str] = set()
    print(f"downloading the build requirements {', '.join(build)}", flush=True)
    _download(build, folder)
    fetched.update(_normal(Requirement(text).name) for text in build)
    # a package of the image that a carried wheel wants in some version: its newest wheel goes along
    # too, which pip uses only where the image's version does not satisfy the requirement
    fallbacks: dict[str, str] = {}
    top = True
    while wanted:
        level = []
        for text in wanted:
            requirement = Requirement(text)
            name = _normal(requirement.name)
            if requirement.marker is not None and not requirement.marker.evaluate(TARGET):
                continue
            if name in PRESENT and not top and requirement.specifier:
                fallbacks.setdefault(name, str(requirement).split(";")[0].strip())
            if name in PRESENT or name in fetched:
                continue
            fetched.add(name)
            level.append(str(requirement).split(";")[0].strip())
        wanted, top = [], False
        if not level:
            break
        print(f"downloading {', '.join(level)}", flush=True)
        before = set(folder.glob("*.whl"))
        _download(level, folder)
        for wheel in sorted(set(folder.glob("*.whl")) - before):
            if _wheel_name(wheel) in {_normal(Requirement(c).name) for c in CHECK_WHEELS}:
                continue  # installed without dependencies (CUPTI's match the image's CUDA)
            wanted += _requires(wheel)
    for name, text in sorted(fallbacks.items()):
        try:
            _download([text], folder)
            print(f"downloaded {text} (used only where the image's {name} is older)", flush=True)
        except SystemExit as error:
            print(f"warning: {error}", file=sys.stderr)
    wheels = sorted(folder.glob("*.whl"))
    size = sum(w.stat().st_size for w in wheels)
    tree = tree_bytes()
    manifest = {
        "wheels": [w.name for w in wheels],
        "bytes": size,
        "tree_bytes": tree,
        "check_wheels": [_normal(Requirement(c).name) for c in CHECK_WHEELS],
        "fallbacks": sorted(fallbacks.values()),
    }
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    print(
        f"{len(wheels)} wheels, {size / 2**20:.1f} MiB; working tree {tree / 2**20:.1f} MiB;"
        f" together {(size + tree) / 2**20:.1f} MiB of the {LIMIT // 2**20} MiB a lease carries"
    )
    if size + tree > LIMIT:
        raise SystemExit(f"gpu-check prepare: {(size + tree) / 2**20:.1f} MiB is over the {LIMIT // 2**20} MiB limit")


# ------------------------------------------------------------------ run (there)
def _results_module() -> Any:
    spec = importlib.util.spec_from_file_location("bench_results", ROOT / "benchmarks" / "_results.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tail(text: str, n: int = 4000) -> str:
    return text[-n:]


def native_modules() -> list[str]:
    """The C extension modules of gpuviz: every ``PyInit_<name>`` in csrc/<layer>/*.c."""
    found = set()
    for source in (ROOT / "csrc").glob("*/*.c"):
        package = f"gpuviz.{source.parent.name}"
        for name in re.findall(r"PyMODINIT_FUNC\s+PyInit_(\w+)\s*\(", source.read_text(encoding="utf-8")):
            found.add(f"{package}.{name}")
    return sorted(found)


def step_install(dry: bool, wheels: Path, work: Path, timeout: float, log: list[str]) -> dict[str, Any]:
    """Build and install gpuviz from this tree with the carried wheels; then which native modules load."""
    if not dry:
        manifest = json.loads((wheels / "manifest.json").read_text(encoding="utf-8"))
        pip = [sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(wheels), "--no-cache-dir"]
        done = subprocess.run([*pip, str(ROOT)], capture_output=True, text=True, timeout=timeout)
        log.append(done.stdout + done.stderr)
        if done.returncode != 0:
            return {
                "status": "failed",
                "summary": "pip install of gpuviz failed: " + _tail(done.stdout + done.stderr, 600),
            }
        extra = [str(wheels / w) for w in manifest["wheels"] if _wheel_name(Path(w)) in manifest["check_wheels"]]
        if extra:  # the checks' own wheels (CUPTI's bindings): a failure shows in the step that needs them
            done = subprocess.run([*pip, "--no-deps", *extra], capture_output=True, text=True, timeout=timeout)
            log.append(done.stdout + done.stderr)
    probe = (
        "import importlib, json, sys\nout = {}\nfor m in sys.argv[1:]:\n    try:\n        importlib.import_module(m)\n"
        "        out[m] = 'loaded'\n    except Exception as e:\n        out[m] = f'{type(e).__name__}: {e}'\n"
        "import gpuviz\nprint(json.dumps({'modules': out, 'gpuviz': gpuviz.__file__}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, *native_modules()], capture_output=True, text=True, cwd=work, timeout=120
    )
    log.append(done.stdout + done.stderr)
    if done.returncode != 0:
        return {"status": "failed", "summary": "import gpuviz failed: " + _tail(done.stderr, 600)}
    found = json.loads(done.stdout.strip().splitlines()[-1])
    missing = {m: why for m, why in found["modules"].items() if why != "loaded"}
    details = {"gpuviz": found["gpuviz"], "native_modules": found["modules"]}
    if not dry and Path(found["gpuviz"]).resolve().is_relative_to(ROOT):
        return {
            "status": "failed",
            "summary": f"the source tree's gpuviz was imported, not the installed one: {found['gpuviz']}",
        }
    metrics = [["native modules loaded", len(found["modules"]) - len(missing), ""]]
    if missing:
        return {
            "status": "failed",
            "summary": f"native modules not loaded: {', '.join(missing)}",
            "details": details,
            "metrics": metrics,
        }
    how = "tree on the path (dry run: not installed)" if dry else "installed from source with the carried wheels"
    return {
        "status": "simulated" if dry else "ok",
        "summary": f"gpuviz {how}; every native module loads",
        "details": details,
        "metrics": metrics,
    }


def gpu_test_files() -> list[Path]:
    """The test modules holding ``gpu``-marked tests."""
    return sorted(p for p in (ROOT / "tests").glob("test_*.py") if "@pytest.mark.gpu" in p.read_text(encoding="utf-8"))


def step_gpu_tests(dry: bool, work: Path, timeout: float, log: list[str]) -> dict[str, Any]:
    """The ``gpu``-marked tests, each module in its own pytest process, from a copy of the tests
    (so that the installed gpuviz, not the source tree, is imported)."""
    copy = work / "suite"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(ROOT / "tests", copy / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    outcomes: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    for module in gpu_test_files():
        report = copy / f"{module.stem}.xml"
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-m",
            "gpu",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rs",
            f"--junitxml={report}",
            f"tests/{module.name}",
        ]
        done = subprocess.run(
            command, capture_output=True, text=True, cwd=copy, timeout=max(10.0, deadline - time.monotonic())
        )
        log.append(f"$ {' '.join(command[2:])}\n{done.stdout}{done.stderr}")
        if not report.exists():
            outcomes[module.name] = f"pytest exited {done.returncode} without a report"
            counts["failed"] += 1
            continue
        for case in ElementTree.parse(report).iter("testcase"):
            name = f"{module.name}::{case.get('name')}"
            if case.find("failure") is not None or case.find("error") is not None:
                outcomes[name] = "failed"
                counts["failed"] += 1
            elif (skip := case.find("skipped")) is not None:
                outcomes[name] = f"skipped: {skip.get('message', '')}"
                counts["skipped"] += 1
            else:
                outcomes[name] = "passed"
                counts["passed"] += 1
    metrics = [[f"gpu tests {k}", v, ""] for k, v in counts.items()]
    summary = ", ".join(f"{v} {k}" for k, v in counts.items())
    if counts["failed"]:
        status = "failed"
    elif dry:
        status = "simulated"  # collected and skipped: no GPU here
    else:
        status = "ok" if counts["passed"] else "failed"
    return {"status": status, "summary": summary, "metrics": metrics, "details": {"tests": outcomes}}


def step_process(name: str, dry: bool, work: Path, timeout: float, log: list[str]) -> dict[str, Any]:
    """One step of gpu_steps.py in a fresh Python process."""
    out = work / f"{name}.json"
    out.unlink(missing_ok=True)
    command = [sys.executable, str(STEPS), name, "--json", str(out), *(["--dry-run"] if dry else [])]
    done = subprocess.run(command, capture_output=True, text=True, cwd=work, timeout=timeout)
    log.append(f"$ {name}\n{done.stdout}{done.stderr}")
    if not out.exists():
        return {
            "status": "failed",
            "summary": f"the step's process exited {done.returncode}: {_tail(done.stderr, 600)}",
        }
    result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    if result["status"] == "failed":
        result["error"] = _tail(done.stderr, 3000)
    return result


def document(
    results: Any, steps: list[dict[str, Any]], dry: bool, started: float, env: dict[str, Any]
) -> dict[str, Any]:
    """The results file: the benchmark schema (a status and the numbers of each step) plus ``steps``."""
    doc: dict[str, Any] = results.as_dict()
    doc["description"] = (
        "Every GPU check: gpuviz built from source, the gpu-marked tests, a real PyTorch snapshot, "
        "PyTorch and CuPy on gpuviz's BFC, CUPTI transfers" + (" (dry run: the simulated device)." if dry else ".")
    )
    machine = doc["machine"]
    for key in ("gpus", "driver", "torch", "torch_cuda", "cupy"):
        if env.get(key):
            value = env[key]
            machine[key if key != "gpus" else "gpu"] = ", ".join(g["name"] for g in value) if key == "gpus" else value
    rows = []
    for step in steps:
        rows.append(
            {"name": f"{step['name']}: status", "value": step["status"], "unit": "", "note": step.get("summary", "")}
        )
        for name, value, unit in step.get("metrics", []):
            rows.append({"name": f"{step['name']}: {name}", "value": value, "unit": unit})
        rows.append({"name": f"{step['name']}: time", "value": round(step.get("seconds", 0.0), 1), "unit": "s"})
    doc["results"] = rows
    doc["steps"] = steps
    doc["seconds"] = round(time.monotonic() - started, 1)
    return doc


def run(dry: bool, out: Path, wheels: Path, budget: float, only: list[str] | None) -> int:
    started = time.monotonic()
    results = _results_module().Results("gpu-check", "", {"dry_run": dry})
    work = Path(tempfile.mkdtemp(prefix="gpuviz-gpu-check-"))
    logs: list[str] = []
    steps: list[dict[str, Any]] = []
    env: dict[str, Any] = {}
    out.parent.mkdir(parents=True, exist_ok=True)
    if not dry and not (wheels / "manifest.json").exists():
        print(
            f"gpu-check: no {wheels}/manifest.json: run `.ci/gpu-check prepare` first (with network)", file=sys.stderr
        )
        return 2
    for name, limit in PLAN:
        if only and name not in only:
            continue
        left = budget - (time.monotonic() - started)
        step_start = time.monotonic()
        print(f"[{time.monotonic() - started:6.1f} s] {name} ...", flush=True)
        if left < 20:
            result: dict[str, Any] = {"status": "failed", "summary": "not run: the time budget was spent"}
        else:
            timeout = min(limit, left - 10)
            try:
                if name == "install":
                    result = step_install(dry, wheels, work, timeout, logs)
                elif name == "gpu-tests":
                    result = step_gpu_tests(dry, work, timeout, logs)
                else:
                    result = step_process(name, dry, work, timeout, logs)
            except subprocess.TimeoutExpired:
                result = {"status": "failed", "summary": f"timed out after {timeout:.0f} s"}
        result = {"name": name, **result}
        result.setdefault("seconds", round(time.monotonic() - step_start, 2))
        if name == "environment":
            env = result.get("details", {})
        steps.append(result)
        print(f"           {name}: {result['status']}: {result.get('summary', '')}", flush=True)
        out.write_text(
            json.dumps(document(results, steps, dry, started, env), indent=1, default=str) + "\n", encoding="utf-8"
        )
        (out.parent / (out.stem + ".log")).write_text("\n".join(logs), encoding="utf-8")
    good = {"simulated"} if dry else {"ok"}
    bad = [s["name"] for s in steps if s["status"] not in good]
    print(
        f"gpu-check: {len(steps) - len(bad)} of {len(steps)} steps {'/'.join(good)}"
        + (f"; not: {', '.join(bad)}" if bad else "")
        + f"; results in {out}"
    )
    return 1 if bad else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["prepare", "run"])
    parser.add_argument(
        "--wheels", type=Path, default=ROOT / ".gpu-wheels", help="the carried wheels (default: %(default)s)"
    )
    parser.add_argument("--dry-run", action="store_true", help="run: the same steps on the simulated device")
    parser.add_argument(
        "--out", type=Path, help="run: the results JSON (default: $OUT/gpu-check.json, else ./gpu-check.json)"
    )
    parser.add_argument("--budget", type=float, default=540, help="run: seconds for all steps (default: %(default)s)")
    parser.add_argument("--only", nargs="+", choices=[name for name, _ in PLAN], help="run: these steps only")
    args = parser.parse_args()
    if args.command == "prepare":
        prepare(args.wheels)
        return
    out = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else Path.cwd()) / "gpu-check.json"
    sys.exit(run(args.dry_run, out, args.wheels, args.budget, args.only))


if __name__ == "__main__":
    main()
