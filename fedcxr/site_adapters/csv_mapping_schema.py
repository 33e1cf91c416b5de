"""The YAML column mapping of SOURCE ``csv``, as a pydantic model: keys, values and their checks.

Why a module of its own: the mapping is a user-facing schema (about forty keys, each with its
own shorthand and check) while the adapter (:mod:`fedcxr.site_adapters.csv_mapping`) turns a
validated mapping into canonical rows. The schema's reference — every key, its default and an
example — is the adapter's module doc, which ``fedcxr ingest csv --help`` prints.

:func:`load_mapping` reads the file through the bounded YAML reader (:mod:`fedcxr.yamlfile`) and
validates it before any row is read; every problem becomes an :class:`IngestError` (exit 2)
naming the key at fault, one line per key (:func:`describe`).
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal, Optional

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fedcxr.errors import UserError
from fedcxr.site_adapters.base import IngestError
from fedcxr.site_adapters.tables import deeper_hint
from fedcxr.suggest import did_you_mean, known_keys
from fedcxr.vocab import AUX_VOCAB, CLASSES, canonical_class
from fedcxr.yamlfile import read_yaml

#: Used when a ``labels`` entry gives no ``values``: the CheXpert/MIMIC numeric encoding.
DEFAULT_LABEL_VALUES: dict[str, Optional[float]] = {
    "1": 1.0, "1.0": 1.0, "0": 0.0, "0.0": 0.0, "-1": -1.0, "-1.0": -1.0, "": None,
}
#: Used when ``split`` gives no ``values``.
DEFAULT_SPLIT_VALUES: dict[str, Optional[str]] = {
    "train": "train", "val": "val", "validate": "val", "valid": "val", "validation": "val",
    "test": "test", "train_val": "train_val", "": None,
}


def _label_value(value: Optional[float]) -> Optional[float]:
    if value is None:
        return None
    if value not in (1.0, 0.0, -1.0):
        raise ValueError(f"label value must be 1, 0, -1 or null, got {value!r}")
    return float(value)


def _class_name(name: str) -> str:
    cls = canonical_class(name)
    if cls is None:
        raise ValueError(f"unknown class {name!r}{did_you_mean(name, CLASSES)}; canonical classes: {', '.join(CLASSES)}")
    return cls


def _as_float(value: Any) -> Optional[float]:
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"expected set_aside, null, 1, 0 or -1, got {value!r}") from None


LabelValue = Annotated[Optional[float], AfterValidator(_label_value)]
ClassName = Annotated[str, AfterValidator(_class_name)]


def _str_keys(value: Any) -> Any:
    """YAML turns keys like ``1`` or ``~`` into int/None; the CSV holds text."""
    if isinstance(value, dict):
        return {("" if k is None else str(k)): v for k, v in value.items()}
    return value


def _column_shorthand(value: Any) -> Any:
    return {"column": value} if isinstance(value, str) else value


def _relative(path: str, key: str) -> str:
    posix = PurePosixPath(path.replace("\\", "/"))
    if posix.is_absolute() or ".." in posix.parts:
        raise ValueError(f"{key} must be a path inside --input, got {path!r}")
    return path


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ImageSpec(_Strict):
    column: str
    prefix: str = ""
    extension: str = ""

    @field_validator("prefix")
    @classmethod
    def _prefix_inside(cls, value: str) -> str:
        return _relative(value, "image.prefix") if value else value


class ClassColumn(_Strict):
    column: str
    values: Optional[dict[str, LabelValue]] = None
    default: Any = "set_aside"

    @field_validator("values", mode="before")
    @classmethod
    def _text_keys(cls, value: Any) -> Any:
        return _str_keys(value)


    @field_validator("default")
    @classmethod
    def _default(cls, value: Any) -> Any:
        if value == "set_aside" or value is None:
            return value
        return _label_value(_as_float(value))


class FindingSpec(_Strict):
    column: str
    values: dict[str, dict[ClassName, LabelValue]]
    unlabeled: list[str] = Field(default_factory=list)
    unmentioned: Optional[Literal[0]] = None
    default: Any = "set_aside"

    @field_validator("default")
    @classmethod
    def _default(cls, value: Any) -> Any:
        if value == "set_aside" or value is None:
            return value
        if not isinstance(value, dict):
            raise ValueError(f"expected set_aside, null or a map {{class: value}}, got {value!r}")
        return {_class_name(str(k)): _label_value(_as_float(v)) for k, v in value.items()}

    @field_validator("values", mode="before")
    @classmethod
    def _text_keys(cls, value: Any) -> Any:
        return _str_keys(value)

    @field_validator("unlabeled", mode="before")
    @classmethod
    def _unlabeled_text(cls, value: Any) -> Any:
        return ["" if v is None else str(v) for v in value] if isinstance(value, list) else value


def _dicom_keyword(value: Optional[str]) -> Optional[str]:
    if value is None:
        return None
    from pydicom.datadict import tag_for_keyword

    if tag_for_keyword(value) is None:
        raise ValueError(f"{value!r} is not a DICOM keyword (e.g. PatientSex, PatientAge, ViewPosition)")
    return value


class _FromColumnOrTag(_Strict):
    """A value read from a csv ``column`` or from a ``dicom_tag`` of the image the row names."""

    column: Optional[str] = None
    dicom_tag: Annotated[Optional[str], AfterValidator(_dicom_keyword)] = None

    @model_validator(mode="after")
    def _one_source(self):
        if (self.column is None) == (self.dicom_tag is None):
            raise ValueError("give exactly one of 'column' (a csv column) or 'dicom_tag' (a DICOM keyword)")
        return self

    @property
    def source(self) -> str:
        """How messages name where the value came from."""
        return f"column {self.column!r}" if self.column is not None else f"DICOM tag {self.dicom_tag}"


class Demographic(_FromColumnOrTag):
    values: dict[str, Optional[str]] = Field(default_factory=dict)
    on_unknown: Literal["set_aside", "null"] = "null"

    @field_validator("values", mode="before")
    @classmethod
    def _text_keys(cls, value: Any) -> Any:
        return _str_keys(value)


class AgeSpec(_FromColumnOrTag):
    on_unknown: Literal["set_aside", "null"] = "null"


class RaceSpec(Demographic):
    ethnicity_column: Optional[str] = None


#: ``demographics: {from_dicom: true}``: these fields from these tags, unless given explicitly.
FROM_DICOM = {"sex": "PatientSex", "age": "PatientAge", "view": "ViewPosition"}


class Demographics(_Strict):
    from_dicom: bool = False
    sex: Optional[Demographic] = None
    age: Optional[AgeSpec] = None
    view: Optional[Demographic] = None
    race: Optional[RaceSpec] = None

    @field_validator("sex", "age", "view", "race", mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        return _column_shorthand(value)

    @model_validator(mode="after")
    def _from_dicom(self) -> "Demographics":
        if self.from_dicom:
            for task, tag in FROM_DICOM.items():
                if getattr(self, task) is None:
                    spec = AgeSpec(dicom_tag=tag) if task == "age" else Demographic(dicom_tag=tag)
                    setattr(self, task, spec)
        return self

    def dicom_tags(self) -> list[str]:
        """DICOM keywords some field is read from (empty: no image is opened for demographics)."""
        specs = (self.sex, self.age, self.view, self.race)
        return list(dict.fromkeys(s.dicom_tag for s in specs if s is not None and s.dicom_tag))

    @model_validator(mode="after")
    def _vocab_values(self) -> "Demographics":
        for task in ("sex", "view", "race"):
            spec = getattr(self, task)
            if spec is None:
                continue
            for key, target in spec.values.items():
                if target is not None and target not in AUX_VOCAB[task]:
                    raise ValueError(
                        f"{task}.values[{key!r}]: {target!r} is not one of {AUX_VOCAB[task]} or null"
                    )
        return self


class SplitSpec(_Strict):
    column: str
    values: Optional[dict[str, Optional[Literal["train", "val", "test", "train_val"]]]] = None

    @field_validator("values", mode="before")
    @classmethod
    def _text_keys(cls, value: Any) -> Any:
        return _str_keys(value)


class RowFilter(_Strict):
    column: str
    in_: Optional[list[str]] = Field(default=None, alias="in")
    not_in: Optional[list[str]] = None

    @field_validator("in_", "not_in", mode="before")
    @classmethod
    def _as_text(cls, value: Any) -> Any:
        return ["" if v is None else str(v) for v in value] if isinstance(value, list) else value

    @model_validator(mode="after")
    def _one_rule(self) -> "RowFilter":
        if (self.in_ is None) == (self.not_in is None):
            raise ValueError("give exactly one of 'in' or 'not_in'")
        return self


class CsvMapping(_Strict):
    """The validated YAML mapping (see the module doc for every key)."""

    version: Literal[1] = 1
    description: str = ""
    csv: str
    delimiter: str = ","
    encoding: str = "utf-8"
    image: ImageSpec
    patient: str
    study: Optional[str] = None
    classes: list[ClassName]
    labels: dict[ClassName, ClassColumn] = Field(default_factory=dict)
    finding: Optional[FindingSpec] = None
    constant: dict[ClassName, Annotated[float, AfterValidator(_label_value)]] = Field(default_factory=dict)
    demographics: Demographics = Field(default_factory=Demographics)
    groups: dict[str, str] = Field(default_factory=dict)
    split: Optional[SplitSpec] = None
    keep_rows: list[RowFilter] = Field(default_factory=list)

    @field_validator("image", "split", mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        return _column_shorthand(value)

    @field_validator("labels", mode="before")
    @classmethod
    def _label_shorthand(cls, value: Any) -> Any:
        return {k: _column_shorthand(v) for k, v in value.items()} if isinstance(value, dict) else value

    @field_validator("csv")
    @classmethod
    def _csv_inside(cls, value: str) -> str:
        return _relative(value, "csv")

    @field_validator("delimiter")
    @classmethod
    def _one_char(cls, value: str) -> str:
        if len(value) != 1:
            raise ValueError(f"delimiter must be one character, got {value!r}")
        return value

    @field_validator("groups", mode="before")
    @classmethod
    def _group_list(cls, value: Any) -> Any:
        return {str(c): str(c) for c in value} if isinstance(value, list) else value

    @field_validator("groups")
    @classmethod
    def _group_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not name.replace("_", "").replace("-", "").isalnum():
                raise ValueError(f"group name {name!r}: use letters, digits, '_' or '-' only")
        return value

    @model_validator(mode="after")
    def _one_source_per_class(self) -> "CsvMapping":
        if not self.classes:
            raise ValueError("classes: list at least one canonical class")
        if len(set(self.classes)) != len(self.classes):
            raise ValueError(f"classes: listed twice: {sorted({c for c in self.classes if self.classes.count(c) > 1})}")
        if self.labels and self.finding is not None:
            raise ValueError("give either 'labels' (one column per class) or 'finding' (one finding column), not both")
        named: dict[str, str] = {}
        for key, classes in self._sources().items():
            for cls in classes:
                if cls not in self.classes:
                    raise ValueError(f"{key}: class {cls!r} is not listed in 'classes'")
                if key.split(".")[0] != named.setdefault(cls, key).split(".")[0]:
                    raise ValueError(f"class {cls!r} has two label sources ({named[cls]} and {key})")
        without = [c for c in self.classes if c not in named and self.finding is None]
        if without:
            raise ValueError(f"classes: {without} have no label source (labels, finding or constant)")
        return self

    def _sources(self) -> dict[str, list[str]]:
        """Key in the mapping → classes it labels (for the consistency checks)."""
        out: dict[str, list[str]] = {f"labels.{c}": [c] for c in self.labels}
        out.update({f"constant.{c}": [c] for c in self.constant})
        if self.finding is not None:
            for value, labels in self.finding.values.items():
                out[f"finding.values[{value!r}]"] = list(labels)
            if isinstance(self.finding.default, dict):
                out["finding.default"] = list(self.finding.default)
        return out

    def finding_classes(self) -> list[str]:
        """Classes the finding column labels: every listed class without a constant."""
        return [c for c in self.classes if c not in self.constant] if self.finding else []


def load_mapping(path: Path | str) -> CsvMapping:
    """Read and validate a mapping file; :class:`IngestError` naming the key on any problem."""
    path = Path(path)
    if not path.is_file():
        raise IngestError(f"--mapping {path}: no such file" + deeper_hint(path))
    try:  # UTF-8, bounded in size and in alias expansion (fedcxr.yamlfile)
        raw = read_yaml(path, "mapping file")
    except UserError as exc:
        raise IngestError(str(exc)) from None
    if not isinstance(raw, dict):
        raise IngestError(f"{path}: expected a mapping of keys (csv, image, patient, classes, ...)")
    try:
        return CsvMapping.model_validate(raw)
    except ValidationError as exc:
        raise IngestError(f"{path}: invalid mapping:\n" + describe(exc)) from None


def describe(exc: ValidationError) -> str:
    """One line per problem: the key path, then what is wrong in plain words."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith(("function-", "literal[", "union[", "dict[")))
        kind = err["type"]
        if kind == "missing":
            msg = "missing required key"
        elif kind == "extra_forbidden":
            msg = "unknown key" + did_you_mean(err["loc"][-1] if err["loc"] else None,
                                               known_keys(CsvMapping, err["loc"][:-1]))
        else:
            msg = str(err["msg"]).removeprefix("Value error, ")
            if "input" in err and kind not in ("value_error",):
                msg += f" (got {err['input']!r})"
        lines.append(f"  {loc or '(top level)'}: {msg}")
    return "\n".join(dict.fromkeys(lines))


__all__ = ["CsvMapping", "DEFAULT_LABEL_VALUES", "DEFAULT_SPLIT_VALUES", "FROM_DICOM", "describe", "load_mapping"]
