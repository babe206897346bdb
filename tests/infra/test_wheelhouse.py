"""The offline wheelhouse of GPU pools (infra/wheelhouse.py): what it keeps, what it refuses, and the node's offline install.

No test here reaches a package index: pip download is stood in for where a wheelhouse is built, and the
install round trip builds its wheels from throwaway packages with ``pip wheel --no-deps --no-index``."""

import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from infra import wheelhouse
from infra.wheelhouse import normalise, read_have, read_pins, select
from tasks.common.config.errors import UserError
from tests.conftest import ROOT

# the node's install, as infra/wheelhouse.py and infra/README.md give it
INSTALL = "python3 -m pip install --no-index --find-links .whl -r requirements-gpu-pool.txt"


def test_names_compare_as_pep_503_normalises_them():
    assert {normalise(n) for n in ("PyYAML", "typing_extensions", "Typing.Extensions", "ruamel.yaml-clib", "zope__interface")} == \
        {"pyyaml", "typing-extensions", "ruamel-yaml-clib", "zope-interface"}


def test_a_freeze_listing_gives_its_names_with_or_without_versions():
    text = """# the node's pip list --format=freeze
PyYAML==6.0.3
typing_extensions==4.16.0
torch @ file:///wheels/torch-2.11.0-cp312-cp312-linux_x86_64.whl
-e git+https://example.invalid/repo.git#egg=local
--find-links /somewhere

numpy
jax[cuda13]==0.11.2
nvidia-ml-py===13.615.71  # a comment
"""
    assert read_have(text) == {"pyyaml": "6.0.3", "typing-extensions": "4.16.0", "torch": None, "numpy": None, "jax": "0.11.2",
                               "nvidia-ml-py": "13.615.71"}


def test_a_line_that_names_no_distribution_is_refused_naming_it():
    with pytest.raises(UserError, match=r"--have line 2 'numpy 2\.5\.2' is not 'name==version' or a bare distribution name"):
        read_have("torch==2.11.0\nnumpy 2.5.2\n")
    with pytest.raises(UserError, match=r"line 1 '==1\.0'"):
        read_have("==1.0\n")


def test_the_node_list_parses_and_holds_none_of_the_pools_packages():
    versions = read_have((ROOT / "infra" / "gpu-node-packages.txt").read_text())
    node = set(versions)
    assert versions["numpy"] == "2.5.2" and versions["torch"] == "2.11.0" and versions["scipy"] is None
    assert {"torch", "jax", "jaxlib", "numpy", "triton", "scipy", "pandas", "xarray", "numba", "psutil", "pyyaml"} <= node
    assert not {"prefect", "mlflow", "mlflow-skinny", "zarr", "pydantic", "dask", "distributed", "prefect-dask", "mlxtend"} & node
    pool = read_pins((ROOT / "requirements-gpu-pool.txt").read_text())
    assert pool == {"prefect", "fastapi", "mlflow-skinny", "dask", "distributed", "prefect-dask", "zarr", "pydantic", "mlxtend", "mlperf-logging"}
    assert not pool & node, "a pin of a package the node has would replace the node's copy"


def test_wheels_of_what_the_node_has_are_dropped_unless_the_requirements_name_them():
    wheels = ["numpy-2.5.5-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
              "typing_extensions-4.16.0-py3-none-any.whl", "PyYAML-6.0.4-cp312-cp312-manylinux2014_x86_64.whl",
              "pydantic-2.14.3-py3-none-any.whl", "zarr-3.1.6-py3-none-any.whl", "ruamel_yaml_clib-0.2.15-cp312-cp312-manylinux2014_x86_64.whl"]
    kept, dropped = select(wheels, have={"numpy", "typing-extensions", "pyyaml", "pydantic"}, pins={"pydantic", "zarr"})
    assert kept == ["pydantic-2.14.3-py3-none-any.whl", "ruamel_yaml_clib-0.2.15-cp312-cp312-manylinux2014_x86_64.whl",
                    "zarr-3.1.6-py3-none-any.whl"]
    assert dropped == ["PyYAML-6.0.4-cp312-cp312-manylinux2014_x86_64.whl",
                       "numpy-2.5.5-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl", "typing_extensions-4.16.0-py3-none-any.whl"]


def test_pip_downloads_binary_wheels_for_the_nodes_python_and_manylinux_x86_64(tmp_path):
    command = wheelhouse.download_command(Path("requirements-gpu-pool.txt"), "3.12", tmp_path)
    joined = " ".join(command)
    assert command[:4] == [sys.executable, "-m", "pip", "download"]
    for part in ("--only-binary=:all:", "--python-version 3.12", "--implementation cp", "--platform manylinux_2_28_x86_64",
                 "--platform manylinux_2_17_x86_64", "--platform manylinux2014_x86_64", f"--dest {tmp_path}", "-r requirements-gpu-pool.txt"):
        assert part in joined


def _fake_wheel(path: Path, requires: tuple[str, ...] = ()) -> None:
    """A wheel file holding only its METADATA (name, version and ``requires`` as Requires-Dist)."""
    name, version = path.name.split("-")[:2]
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}-{version}.dist-info/METADATA", metadata + "\nDescription: Requires-Dist: not-a-header\n")


def _fake_pip(wheels: dict[str, tuple[str, ...]], returncode: int = 0):
    """A stand-in for subprocess.run of pip download: writes the wheels named in ``wheels`` (each with
    what it requires) into --dest."""
    def run(command, **kwargs):
        dest = Path(command[command.index("--dest") + 1])
        for wheel, requires in wheels.items():
            _fake_wheel(dest / wheel, requires)
        return subprocess.CompletedProcess(command, returncode)
    return run


def test_a_node_version_outside_what_a_kept_wheel_requires_keeps_that_wheel(tmp_path):
    """Offline, pip can take the node's copy only where its version satisfies; where --have gives a version
    outside a kept wheel's requirement, the wheelhouse keeps the wheel pip resolved (also for what that wheel
    needs in turn). Unknown versions, extras' and other platforms' requirements change nothing."""
    _fake_wheel(tmp_path / "prefect-3.8.8-py3-none-any.whl", ("python-dateutil<3.0.0,>=2.8.2", "rich<16.0,>=11.0", "anyio<5",
                                                              "colorama; sys_platform == 'win32'", "pyyaml<6; extra == 'old'",
                                                              "tomli<2; python_version < '3.11'"))
    _fake_wheel(tmp_path / "python_dateutil-2.9.0.post0-py2.py3-none-any.whl", ("six>=1.5",))
    for wheel in ("six-1.17.0-py2.py3-none-any.whl", "rich-15.0.0-py3-none-any.whl", "anyio-4.16.0-py3-none-any.whl",
                  "colorama-0.4.6-py2.py3-none-any.whl", "PyYAML-6.0.4-cp312-cp312-manylinux2014_x86_64.whl", "tomli-1.2.0-py3-none-any.whl"):
        _fake_wheel(tmp_path / wheel)
    have = {"python-dateutil": "4.0.0", "six": "1.4.0", "rich": "15.0.0", "anyio": None, "colorama": "0.1", "pyyaml": "6.0.3", "tomli": "2.0"}
    kept, dropped = select([p.name for p in tmp_path.iterdir()], have, pins={"prefect"})
    assert kept == ["prefect-3.8.8-py3-none-any.whl"]
    kept, dropped, why = wheelhouse.keep_unmet(tmp_path, kept, dropped, have, "3.12")
    assert kept == ["prefect-3.8.8-py3-none-any.whl", "python_dateutil-2.9.0.post0-py2.py3-none-any.whl", "six-1.17.0-py2.py3-none-any.whl"]
    assert why == ["kept python_dateutil-2.9.0.post0-py2.py3-none-any.whl: the node's python-dateutil 4.0.0 is outside prefect's python-dateutil<3.0.0,>=2.8.2",
                   "kept six-1.17.0-py2.py3-none-any.whl: the node's six 1.4.0 is outside python-dateutil's six>=1.5"]
    assert wheelhouse.keep_unmet(tmp_path, ["prefect-3.8.8-py3-none-any.whl"], dropped, {"python-dateutil": None}, "3.12")[2] == []


def test_a_built_wheelhouse_holds_the_kept_wheels_only_and_nothing_is_left_beside_it(tmp_path, monkeypatch, capsys):
    (tmp_path / "req.txt").write_text("# pool\nzarr==3.1.6\npydantic==2.14.3\n")
    (tmp_path / "node.txt").write_text("numpy==2.5.2\npydantic\n")
    monkeypatch.setattr(wheelhouse.subprocess, "run", _fake_pip({"zarr-3.1.6-py3-none-any.whl": ("numpy>=2.0", "donfig>=0.8"),
                                                                 "numpy-2.5.5-cp312-cp312-manylinux_2_28_x86_64.whl": (),
                                                                 "pydantic-2.14.3-py3-none-any.whl": (), "donfig-0.8.1-py3-none-any.whl": ()}))
    out = tmp_path / "whl"
    assert wheelhouse.main([str(out), "--requirements", str(tmp_path / "req.txt"), "--have", str(tmp_path / "node.txt")]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["donfig-0.8.1-py3-none-any.whl", "pydantic-2.14.3-py3-none-any.whl", "zarr-3.1.6-py3-none-any.whl"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["node.txt", "req.txt", "whl"]
    printed = capsys.readouterr()
    assert printed.out.splitlines()[-1].endswith(" MB  in all: 3 wheels in " + str(out))
    assert "zarr-3.1.6-py3-none-any.whl" in printed.out and "numpy" not in printed.out
    assert "left out 1 wheels the node has: numpy" in printed.err


def test_an_empty_out_dir_is_filled_and_a_failed_download_writes_nothing(tmp_path, monkeypatch):
    (tmp_path / "req.txt").write_text("zarr==3.1.6\n")
    (tmp_path / "empty").mkdir()
    monkeypatch.setattr(wheelhouse.subprocess, "run", _fake_pip({"zarr-3.1.6-py3-none-any.whl": ()}))
    assert wheelhouse.main([str(tmp_path / "empty"), "--requirements", str(tmp_path / "req.txt")]) == 0
    assert [p.name for p in (tmp_path / "empty").iterdir()] == ["zarr-3.1.6-py3-none-any.whl"]
    monkeypatch.setattr(wheelhouse.subprocess, "run", _fake_pip({"zarr-3.1.6-py3-none-any.whl": ()}, returncode=1))
    assert wheelhouse.main([str(tmp_path / "failed"), "--requirements", str(tmp_path / "req.txt")]) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "req.txt"]


def _refused(tmp_path: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "infra.wheelhouse", str(tmp_path / "out"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out-*"))
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_bad_input_is_refused_in_one_line_with_exit_2_and_nothing_written(tmp_path):
    prefix = "python -m infra.wheelhouse: error: "
    assert _refused(tmp_path, "--python", "3") == prefix + "--python '3' must be a Python version MAJOR.MINOR, like 3.12 (CPython 3 only)"
    assert _refused(tmp_path, "--python", "abc") == prefix + "--python 'abc' must be a Python version MAJOR.MINOR, like 3.12 (CPython 3 only)"
    missing = str(tmp_path / "missing.txt")
    assert _refused(tmp_path, "--requirements", missing) == \
        prefix + f"--requirements '{missing}' cannot be read (No such file or directory); give a readable text file"
    assert _refused(tmp_path, "--have", missing) == prefix + f"--have '{missing}' cannot be read (No such file or directory); give a readable text file"
    assert _refused(tmp_path, "--have", str(tmp_path)) == prefix + f"--have '{tmp_path}' cannot be read (Is a directory); give a readable text file"
    (tmp_path / "binary").write_bytes(b"\xff\xfe\x00")
    assert _refused(tmp_path, "--have", str(tmp_path / "binary")).endswith("cannot be read (not UTF-8 text); give a readable text file")
    (tmp_path / "freeze.txt").write_text("numpy 2.5.2\n")
    assert _refused(tmp_path, "--have", str(tmp_path / "freeze.txt")) == \
        prefix + f"--have '{tmp_path / 'freeze.txt'}' line 1 'numpy 2.5.2' is not 'name==version' or a bare distribution name"
    assert _refused(tmp_path, "--pyth", "3.12").startswith(prefix + "unrecognized arguments: --pyth")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "old.whl").write_text("")
    done = subprocess.run([sys.executable, "-m", "infra.wheelhouse", str(tmp_path / "full")], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (2, f"{prefix}OUT_DIR '{tmp_path / 'full'}' is not empty; name a new or empty folder\n")
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["old.whl"]


def _wheel(source: Path, name: str, version: str, requires: list[str], out: Path) -> None:
    """A wheel of a throwaway package ``name`` (module ``name`` with underscores) built by pip, offline."""
    module = name.replace("-", "_")
    (source / module).mkdir(parents=True)
    (source / module / "__init__.py").write_text(f"VERSION = {version!r}\n")
    deps = ", ".join(f'"{r}"' for r in requires)
    (source / "pyproject.toml").write_text(f'[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
                                           f'[project]\nname = "{name}"\nversion = "{version}"\ndependencies = [{deps}]\n')
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "--disable-pip-version-check",
                    "--quiet", "--wheel-dir", str(out), str(source)], check=True, capture_output=True, timeout=60)


def test_the_documented_install_takes_the_pools_wheels_offline_and_the_nodes_own_packages_as_they_are(tmp_path):
    """The node is a venv that already holds a package (as the node's Python holds numpy); the pool's package
    needs it and the wheelhouse does not carry it: the documented command installs the pool's package from
    the wheelhouse with --no-index and takes the node's copy as it is."""
    assert INSTALL in wheelhouse.__doc__ and INSTALL in (ROOT / "infra" / "README.md").read_text()
    node_wheels, wheels = tmp_path / "node-wheels", tmp_path / ".whl"
    _wheel(tmp_path / "src-base", "karman-probe-base", "2.0", [], node_wheels)
    _wheel(tmp_path / "src-pool", "karman-probe-pool", "1.0", ["karman-probe-base>=2"], wheels)
    venv.create(tmp_path / "node", with_pip=True)
    python = tmp_path / "node" / "bin" / "python3"
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-index", "--find-links", node_wheels, "karman-probe-base"],
                   check=True, capture_output=True, env=env, timeout=60)
    (tmp_path / "requirements-gpu-pool.txt").write_text("karman-probe-pool==1.0\n")
    command = INSTALL.replace("python3", str(python), 1).split()
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Requirement already satisfied: karman-probe-base>=2" in done.stdout
    check = "import karman_probe_pool, karman_probe_base; print(karman_probe_pool.VERSION, karman_probe_base.VERSION)"
    assert subprocess.run([python, "-c", check], capture_output=True, text=True, check=True).stdout.split() == ["1.0", "2.0"]
