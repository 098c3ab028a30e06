"""cluster_configs/: every KubeRay manifest validates against the CRD schemas in
../shared/data/kuberay-crds/ (jsonschema on spec.versions[v1].schema.openAPIV3Schema, plus the
unknown-field check that kubectl's strict validation does), the pieces point at each other
(Redis address and Secret, run volume), job entrypoints and Serve args are valid raypost
configs, and the cluster-launcher YAML passes Ray's own schema."""

from __future__ import annotations

import copy
import re
import shlex
from typing import Any

import jsonschema
import pytest
import yaml

from tests.conftest import ROOT, SHARED

CONFIGS = ROOT / "cluster_configs"
CRD_FILES = {
    "RayCluster": "ray.io_rayclusters.yaml",
    "RayJob": "ray.io_rayjobs.yaml",
    "RayService": "ray.io_rayservices.yaml",
}
_SCHEMAS: dict[str, dict[str, Any]] = {}


def crd_schema(kind: str) -> dict[str, Any]:
    """openAPIV3Schema of the served, stored version (v1) of a KubeRay CRD."""
    if kind not in _SCHEMAS:
        crd = yaml.load((SHARED / "data" / "kuberay-crds" / CRD_FILES[kind]).read_text(), Loader=yaml.CSafeLoader)
        (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
        assert version["name"] == "v1"
        _SCHEMAS[kind] = version["schema"]["openAPIV3Schema"]
    return _SCHEMAS[kind]


def unknown_fields(obj: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Keys the schema does not declare (kubectl --validate=strict rejects these; jsonschema
    alone accepts them, since CRD schemas leave additionalProperties unset)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(obj, dict) and "properties" in schema:
        found = []
        for key, value in obj.items():
            if key in schema["properties"]:
                found += unknown_fields(value, schema["properties"][key], f"{path}.{key}")
            elif "additionalProperties" not in schema:
                found.append(f"{path}.{key}")
        return found
    if isinstance(obj, dict) and isinstance(schema.get("additionalProperties"), dict):
        return [f for k, v in obj.items() for f in unknown_fields(v, schema["additionalProperties"], f"{path}.{k}")]
    if isinstance(obj, list) and isinstance(schema.get("items"), dict):
        return [f for i, v in enumerate(obj) for f in unknown_fields(v, schema["items"], f"{path}[{i}]")]
    return []


def manifest_errors(doc: dict[str, Any]) -> list[str]:
    schema = crd_schema(doc["kind"])
    errors = [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in jsonschema.Draft7Validator(schema).iter_errors(doc)
    ]
    return errors + [f"unknown field {f}" for f in unknown_fields(doc, schema)]


def documents(pattern: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{p.name}#{i}", d)
        for p in sorted(CONFIGS.glob(pattern))
        for i, d in enumerate(yaml.safe_load_all(p.read_text()))
        if d
    ]


REDIS_TEXT = (CONFIGS / "kuberay" / "redis.yaml").read_text()
KUBERAY = [(n, d) for n, d in documents("kuberay/*.yaml") if d["kind"] in CRD_FILES]
CORE = {f"{d['kind']}/{d['metadata']['name']}": d for _, d in documents("kuberay/*.yaml") if d["kind"] not in CRD_FILES}


def cluster_specs(doc: dict[str, Any]) -> dict[str, Any]:
    spec = doc["spec"]
    nested = {"RayCluster": None, "RayJob": "rayClusterSpec", "RayService": "rayClusterConfig"}[doc["kind"]]
    return spec[nested] if nested else spec


def test_every_kind_is_shipped_with_a_gpu_variant():
    kinds = sorted(d["kind"] for _, d in KUBERAY)
    assert {"RayCluster", "RayJob", "RayService"} <= set(kinds)
    gpu = [
        n
        for n, d in KUBERAY
        if any(
            "nvidia.com/gpu" in c["resources"].get("limits", {})
            for g in cluster_specs(d)["workerGroupSpecs"]
            for c in g["template"]["spec"]["containers"]
        )
    ]
    assert {n.split("#")[0] for n in gpu} >= {"raycluster-gpu.yaml", "rayjob-grpo-gpu.yaml"}


@pytest.mark.parametrize("name,doc", KUBERAY, ids=[n for n, _ in KUBERAY])
def test_manifest_validates_against_crd(name, doc):
    assert doc["apiVersion"] == "ray.io/v1"
    assert manifest_errors(doc) == []


def test_validator_rejects_typos_wrong_types_and_missing_fields():
    (doc,) = [d for n, d in KUBERAY if n == "raycluster.yaml#0"]
    typo = copy.deepcopy(doc)
    typo["spec"]["gcsFaultTolerenceOptions"] = typo["spec"].pop("gcsFaultToleranceOptions")
    assert manifest_errors(typo) == ["unknown field .spec.gcsFaultTolerenceOptions"]
    nested = copy.deepcopy(doc)
    nested["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    assert manifest_errors(nested) == ["unknown field .spec.headGroupSpec.template.spec.containers[0].volumeMount"]
    wrong = copy.deepcopy(doc)
    wrong["spec"]["workerGroupSpecs"][0]["replicas"] = "two"
    assert any("workerGroupSpecs.0.replicas" in e and "'two'" in e for e in manifest_errors(wrong))
    missing = copy.deepcopy(doc)
    del missing["spec"]["headGroupSpec"]
    assert any("'headGroupSpec' is a required property" in e for e in manifest_errors(missing))


@pytest.mark.parametrize("name,doc", KUBERAY, ids=[n for n, _ in KUBERAY])
def test_gcs_fault_tolerance_uses_the_shipped_redis_and_shared_runs(name, doc):
    spec = cluster_specs(doc)
    gcs = spec["gcsFaultToleranceOptions"]
    redis_svc = CORE["Service/raypost-redis"]
    assert gcs["redisAddress"] == f"{redis_svc['metadata']['name']}:{redis_svc['spec']['ports'][0]['port']}"
    ref = gcs["redisPassword"]["valueFrom"]["secretKeyRef"]
    # The password is a Secret the user creates (redis.yaml says how): none is shipped.
    assert not any(k.startswith("Secret/") for k in CORE)
    assert f"kubectl create secret generic {ref['name']} --from-literal={ref['key']}=" in REDIS_TEXT
    # Ray's token auth on every cluster: KubeRay makes the token Secret and sets RAY_AUTH_TOKEN.
    assert spec["authOptions"] == {"mode": "token"}
    redis_env = CORE["Deployment/raypost-redis"]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "REDIS_PASSWORD", "valueFrom": {"secretKeyRef": ref}} in redis_env
    # No work on the head: losing it loses no replica or learner.
    assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    pods = [spec["headGroupSpec"]["template"]] + [g["template"] for g in spec["workerGroupSpecs"]]
    for pod in pods:
        claims = {
            v["persistentVolumeClaim"]["claimName"] for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v
        }
        assert claims == {CORE["PersistentVolumeClaim/raypost-runs"]["metadata"]["name"]}
        assert all({"name": "runs", "mountPath": "/mnt/runs"} in c["volumeMounts"] for c in pod["spec"]["containers"])
    assert CORE["PersistentVolumeClaim/raypost-runs"]["spec"]["accessModes"] == ["ReadWriteMany"]


def _local(arg: str) -> str:
    return str(ROOT / arg[len("/app/") :]) if arg.startswith("/app/") else arg


@pytest.mark.parametrize(
    "name,doc",
    [(n, d) for n, d in KUBERAY if d["kind"] == "RayJob"],
    ids=[n for n, d in KUBERAY if d["kind"] == "RayJob"],
)
def test_rayjob_entrypoint_is_a_valid_resumable_pipeline_command(name, doc):
    from raypost.config import load_config
    from raypost.config.grpo import GRPOConfig
    from raypost.pipelines.registry import ALIASES

    argv = [_local(a) for a in shlex.split(doc["spec"]["entrypoint"])]
    assert argv[:2] == ["python", str(ROOT / "pipelines" / "grpo.py")]
    cfg = load_config(GRPOConfig, argv[2:], aliases=ALIASES)
    assert cfg.run.storage_path == "/mnt/runs" and cfg.run.name != "grpo"  # same folder on every retry
    assert doc["spec"]["backoffLimit"] >= 1
    gpus = sum(
        int(c["resources"]["limits"].get("nvidia.com/gpu", 0)) * g["maxReplicas"]
        for g in doc["spec"]["rayClusterSpec"]["workerGroupSpecs"]
        for c in g["template"]["spec"]["containers"]
    )
    wanted = (
        cfg.resources.num_workers * cfg.resources.gpus_per_worker
        + cfg.rollout.num_replicas * cfg.rollout.gpus_per_replica
    )
    assert gpus >= wanted


def test_rayservice_serves_a_valid_reward_config():
    from serve_apps.reward import config_from_args

    (doc,) = [d for _, d in KUBERAY if d["kind"] == "RayService"]
    serve_cfg = yaml.safe_load(doc["spec"]["serveConfigV2"])
    (app,) = serve_cfg["applications"]
    assert app["import_path"] == "serve_apps.reward:app_builder"
    cfg = config_from_args(app["args"])
    assert cfg.model is not None and cfg.model.path.startswith("/mnt/runs/")
    assert cfg.num_replicas == 2 and serve_cfg["http_options"]["port"] == 8000
    env = doc["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
    assert env[0]["name"] == "RAYPOST_REWARD_TOKEN"  # HTTP is opened to the pod network: require the token
    with pytest.raises(Exception, match="num_replica"):
        config_from_args({**app["args"], "num_replica": 2})


def test_cluster_launcher_yaml_passes_rays_schema():
    from ray.autoscaler._private.util import prepare_config, validate_config

    (path,) = CONFIGS.glob("launcher/*.yaml")
    cfg = yaml.safe_load(path.read_text())
    validate_config(prepare_config(cfg))
    assert any("RAY_REDIS_ADDRESS=" in c for c in cfg["head_start_ray_commands"])
    assert cfg["available_node_types"][cfg["head_node_type"]]["resources"] == {"CPU": 0}
    bad = {**cfg, "head_node_typ": cfg["head_node_type"]}
    with pytest.raises(Exception, match="head_node_typ"):
        validate_config(prepare_config(bad))


def dockerfile_image(text: str) -> tuple[list[tuple[str, str]], set[str], dict[str, str]]:
    """Replay a Dockerfile's WORKDIR/COPY/ENV on the repo: (its instructions, the absolute
    paths of the project files the image holds, its ENV)."""
    lines = text.replace("\\\n", " ").splitlines()
    steps = [
        (w[0].upper(), w[1] if len(w) > 1 else "")
        for line in lines
        if line.strip() and not line.startswith("#")
        for w in [line.split(None, 1)]
    ]
    workdir, files, env = "/", set(), {}
    for op, arg in steps:
        if op == "WORKDIR":
            workdir = arg.strip()
        elif op == "ENV":
            key, _, value = arg.partition("=")
            env[key.strip()] = value.strip()
        elif op == "COPY":
            *sources, dest = [w for w in shlex.split(arg) if not w.startswith("--")]
            base = (dest if dest.startswith("/") else f"{workdir}/{dest}").replace("/./", "/").rstrip("/")
            for src in sources:
                path = ROOT / src
                if path.is_dir():
                    files |= {f"{base}/{f.relative_to(path).as_posix()}" for f in path.rglob("*") if f.is_file()}
                elif path.is_file():
                    files.add(f"{base}/{src}" if dest.endswith("/") else base)
    return steps, files, env


def test_image_holds_what_the_manifests_run():
    """Every script, config and Serve import path a manifest names is in the image where the
    manifest looks for it; the package is installed after its sources are copied; torch is the
    pin of pyproject.toml."""
    steps, files, env = dockerfile_image((CONFIGS / "Dockerfile").read_text())
    workdir = [a for op, a in steps if op == "WORKDIR"][-1]
    needed = []
    for _, doc in KUBERAY:
        if doc["kind"] == "RayJob":
            argv = shlex.split(doc["spec"]["entrypoint"])
            needed += [argv[1], argv[argv.index("--config") + 1]] if "--config" in argv else [argv[1]]
        if doc["kind"] == "RayService":
            for app in yaml.safe_load(doc["spec"]["serveConfigV2"])["applications"]:
                module = app["import_path"].partition(":")[0]
                needed.append(f"{workdir}/{module.replace('.', '/')}.py")
                assert workdir in env["PYTHONPATH"].split(":"), "the Serve import path must import from the workdir"
    assert needed and [p for p in needed if p not in files] == []
    install = next(i for i, (op, a) in enumerate(steps) if op == "RUN" and "pip install" in a and " -e " in a)
    copied_before = dockerfile_image("\n".join(f"{op} {a}" for op, a in steps[:install]))[1]
    assert f"{workdir}/pyproject.toml" in copied_before and f"{workdir}/raypost/__init__.py" in copied_before
    (pin,) = set(re.findall(r'"(torch==[^"]+)"', (ROOT / "pyproject.toml").read_text()))
    assert pin in steps[install][1]


def test_dockerfile_replay_sees_a_missing_copy():
    text = (CONFIGS / "Dockerfile").read_text().replace("COPY --chown=ray:users examples ./examples", "")
    _, files, _ = dockerfile_image(text)
    assert "/app/examples/grpo_tiny.yaml" not in files and "/app/pipelines/grpo.py" in files


def test_readme_explains_every_shipped_file():
    readme = (CONFIGS / "README.md").read_text()
    shipped = [p.relative_to(CONFIGS).as_posix() for p in CONFIGS.rglob("*") if p.is_file() and p.name != "README.md"]
    assert shipped and [p for p in shipped if p not in readme] == []
