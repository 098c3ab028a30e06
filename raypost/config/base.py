"""Typed config plumbing: strict pydantic models, YAML loading, dotted CLI overrides.

Errors are raised once, at the boundary, as :class:`ConfigError` with a message that
names the field, the value and the fix (for unknown keys: the nearest valid key).
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, get_args, get_origin
from urllib.parse import parse_qsl, urlsplit

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, PlainSerializer, SecretStr, ValidationError

T = TypeVar("T", bound="StrictModel")


def _long_enough(value: SecretStr) -> SecretStr:
    if len(value.get_secret_value()) < 16:
        raise ValueError("a token needs at least 16 characters: make one with `openssl rand -hex 16`")
    return value


# A secret (a bearer token): shown as '**********', and written as null to every file a run
# writes (config.yaml, report.json, wandb's config), so a reloaded config takes it from the
# environment variable its field names.
Secret = Annotated[
    SecretStr, AfterValidator(_long_enough), PlainSerializer(lambda _: None, return_type=None, when_used="json")
]
SECRET_WORDS = ("token", "password", "secret", "key")
CREDENTIAL_ENV = {
    "s3": "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or the nodes' IAM role)",
    "gs": "GOOGLE_APPLICATION_CREDENTIALS (or the nodes' service account)",
    "gcs": "GOOGLE_APPLICATION_CREDENTIALS (or the nodes' service account)",
    "abfs": "AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY",
    "abfss": "AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY",
}


def refuse_credentials(uri: str, field: str) -> str:
    """``uri`` unless it carries credentials (``user:pass@`` or a secret-looking query key), which
    would land in config.yaml, logs and wandb: then a ValueError naming the environment to use."""
    if "://" not in uri:
        return uri
    parts = urlsplit(uri)
    secret_query = [k for k, _ in parse_qsl(parts.query) if any(w in k.lower() for w in SECRET_WORDS)]
    if "@" in parts.netloc or secret_query:
        env = CREDENTIAL_ENV.get(parts.scheme, "the store's own environment variables")
        raise ValueError(
            f"{field} carries credentials ({'user info' if '@' in parts.netloc else ', '.join(secret_query)}), "
            f"which would be written to the run's files and logs; remove them and set {env} on every node"
        )
    return uri


class ConfigError(ValueError):
    """A config that cannot be used. The message names the field and the fix."""


class StrictModel(BaseModel):
    """Base for every config section: unknown keys are errors, assignment is validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())


def section_models(annotation: Any) -> list[type[StrictModel]]:
    """The StrictModel classes inside ``annotation`` (``X``, ``X | None``, a union of sections,
    ``Annotated[...]``); not the values of a mapping or list field (their keys are data, not
    config keys)."""
    if isinstance(annotation, type) and issubclass(annotation, StrictModel):
        return [annotation]
    if get_origin(annotation) in (dict, list, tuple):
        return []
    return [sub for arg in get_args(annotation) for sub in section_models(arg)]


def section_model(annotation: Any, data: Any = None) -> type[StrictModel] | None:
    """The section class of a field: of a union of sections (``rollout.weights``), the member
    whose ``Literal`` tag ``data`` names (``transport: collective``), else the first."""
    found = section_models(annotation)
    if len(found) > 1 and isinstance(data, dict):
        for sub in found:
            for key, field in sub.model_fields.items():
                tags = get_args(field.annotation) if get_origin(field.annotation) is Literal else ()
                if key in data and data[key] in tags:
                    return sub
    return found[0] if found else None


def check_keys(model: type[StrictModel], data: Any, prefix: str = "") -> None:
    """Raise ConfigError for the first unknown key in ``data``, naming the nearest valid key."""
    if not isinstance(data, dict):
        return
    fields = model.model_fields
    for key, value in data.items():
        where = f"{prefix}{key}"
        if key not in fields:
            valid = sorted(fields)
            close = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.5)
            hint = f"did you mean '{prefix}{close[0]}'?" if close else f"valid keys here: {', '.join(valid)}"
            raise ConfigError(f"unknown config key '{where}': {hint}")
        sub = section_model(fields[key].annotation, value)
        if sub is not None:
            check_keys(sub, value, prefix=f"{where}.")


def _format_validation_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        if e["type"] == "missing":
            lines.append(f"config field '{loc}' is required: set it in the YAML or pass --{loc} VALUE")
        elif e["type"] == "value_error" and e["msg"].startswith("Value error, "):
            # a cross-field check: its message names the fields and the fix itself
            where = f"{loc}: " if loc else ""
            lines.append(where + e["msg"][len("Value error, ") :])
        elif any(w in loc.lower() for w in SECRET_WORDS):  # never echo a secret
            lines.append(f"config field '{loc}': {e['msg']}")
        else:
            lines.append(f"config field '{loc}': got {e.get('input')!r}; {e['msg']}")
    return "invalid config:\n  " + "\n  ".join(lines)


def with_section_defaults(model: type[BaseModel], data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with, for every section it sets, the values its parent's default for that
    section sets explicitly: ``--run.name x`` keeps GRPOConfig's own ``run.checkpoint_every=10``
    instead of falling back to RunConfig's class defaults."""
    out = dict(data)
    for name, field in model.model_fields.items():
        sub, ann = out.get(name), field.annotation
        if not (isinstance(sub, dict) and isinstance(ann, type) and issubclass(ann, BaseModel)):
            continue
        default = field.get_default(call_default_factory=True) if not field.is_required() else None
        base = default.model_dump(exclude_unset=True) if isinstance(default, BaseModel) else {}
        out[name] = deep_merge(base, with_section_defaults(ann, sub))
    return out


def build(model: type[T], data: dict[str, Any]) -> T:
    """Validate ``data`` into ``model``; every problem becomes one ConfigError."""
    check_keys(model, data)
    data = with_section_defaults(model, data)
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err)) from None


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping; an empty file is an empty mapping."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    data = yaml.safe_load(p.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} must hold a mapping at the top level, got {type(data).__name__}")
    return data


def set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``data['a']['b'] = value`` for ``dotted='a.b'``, creating mappings on the way."""
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"cannot set '{dotted}': '{part}' holds a value, not a section")
        node = child
    node[parts[-1]] = value


def parse_overrides(argv: list[str], aliases: dict[str, str] | None = None) -> tuple[str | None, dict[str, Any]]:
    """Parse ``--config FILE`` and ``--a.b VALUE`` pairs (``--a.b=VALUE`` too).

    Values are parsed as YAML scalars, so ``3e-4`` is a float and ``true`` a bool.
    ``aliases`` maps short flags (``model``) to dotted keys (``model.path``).
    Returns (config path or None, nested override mapping).
    """
    aliases = aliases or {}
    config_path: str | None = None
    overrides: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            raise ConfigError(f"unexpected argument '{arg}': options look like --section.key VALUE")
        key, eq, inline = arg[2:].partition("=")
        if eq:
            raw = inline
            i += 1
        else:
            if i + 1 >= len(argv):
                raise ConfigError(f"option '{arg}' needs a value")
            raw = argv[i + 1]
            i += 2
        if key == "config":
            config_path = raw
            continue
        key = aliases.get(key, key).replace("-", "_")
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        set_dotted(overrides, key, value)
    return config_path, overrides


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """A new mapping: ``base`` with ``extra`` merged in, section by section."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def load_config(
    model: type[T], argv: list[str] | None = None, path: str | Path | None = None, aliases: dict[str, str] | None = None
) -> T:
    """YAML file (``--config`` or ``path``) + dotted CLI overrides -> validated ``model``."""
    cli_path, overrides = parse_overrides(list(argv or []), aliases)
    data: dict[str, Any] = {}
    source = cli_path or path
    if source is not None:
        data = load_yaml(source)
    return build(model, deep_merge(data, overrides))


def dump_yaml(cfg: BaseModel, path: str | Path) -> None:
    """Write a config back as YAML that ``load_config`` reads unchanged."""
    Path(path).write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
