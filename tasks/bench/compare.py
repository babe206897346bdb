"""compare-datasets: how far two stored datasets of one sweep differ, frame by frame (a GPU sweep against the CPU's, one backend against another).

Imports no Prefect or MLflow; reads the zarr store."""

import numpy as np

from tasks.bench.specs import CompareDatasetsSpec
from tasks.common.config.errors import UserError
from tasks.common.config.settings import Settings
from tasks.common.stores.store import VARIABLES, load_manifest, open_simulation

FIELDS = tuple(v for v in VARIABLES if v != "mask")


def compare_datasets(spec: CompareDatasetsSpec) -> dict:
    """Per variable, the largest absolute difference over every frame of every simulation the two hold, the
    root-mean-square difference, and the field's own RMS for scale; per simulation the same, and how each
    dataset was simulated. UserError when they are not the same sweep or share no simulation."""
    settings = Settings.from_env()
    folders = [settings.dataset_dir(name) for name in (spec.first, spec.second)]
    manifests = [load_manifest(folder) for folder in folders]
    if manifests[0]["spec"] != manifests[1]["spec"]:
        raise UserError(f"datasets {spec.first!r} and {spec.second!r} are different sweeps; compare two datasets of one sweep")
    shared = sorted(set(manifests[0]["simulations"]) & set(manifests[1]["simulations"]))
    if not shared:
        raise UserError(f"datasets {spec.first!r} and {spec.second!r} share no complete simulation")
    rows, worst = [], {v: {"max_abs": 0.0, "sq": 0.0, "n": 0, "field_sq": 0.0} for v in FIELDS}
    for sim_id in shared:
        a, b = (open_simulation(folder, sim_id) for folder in folders)
        row = {"sim_id": sim_id, "backends": [a.attrs.get("backend"), b.attrs.get("backend")], "frames": int(a.sizes["time"])}
        for name in FIELDS:
            x, y = a[name].values.astype(np.float64), b[name].values.astype(np.float64)
            diff = np.abs(x - y)
            row[name] = float(diff.max())
            acc = worst[name]
            acc["max_abs"] = max(acc["max_abs"], row[name])
            acc["sq"] += float((diff**2).sum())
            acc["field_sq"] += float((x**2).sum())
            acc["n"] += diff.size
        rows.append(row)
    summary = {name: {"max_abs": acc["max_abs"], "rms": (acc["sq"] / acc["n"]) ** 0.5, "field_rms": (acc["field_sq"] / acc["n"]) ** 0.5}
               for name, acc in worst.items()}
    return {"first": spec.first, "second": spec.second, "simulations": len(shared), "fields": summary, "per_simulation": rows}
