"""Loading weights: a local Hugging Face folder, a GGUF file, a hub id, or the default model.

Everything ends as (our CausalLM, a transformers tokenizer). transformers is used only for
what it is good at here: tokenizers, chat templates and de-quantizing GGUF files.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from .config import ModelConfig
from .config_keys import CONFIG_FAMILIES
from .families import FAMILIES, family_classes
from .model import CausalLM
from .moe.checkpoint import stack_experts


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message says why and how to fix it."""


@dataclass
class LoadedModel:
    model: CausalLM
    tokenizer: object  # a transformers PreTrainedTokenizerBase
    path: Path

    @property
    def config(self) -> ModelConfig:
        return self.model.config

    @property
    def eos_token_ids(self) -> list[int]:
        """The ids that end a generation: the config's EOS ids plus the tokenizer's EOS."""
        ids = list(self.config.eos_token_ids)
        if self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id not in ids:
            ids.append(self.tokenizer.eos_token_id)
        return ids


def read_safetensors_dir(path: Path) -> dict[str, torch.Tensor]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"No *.safetensors files in {path}.")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            state.update(load_file(f))
        except (SafetensorError, OSError, ValueError) as e:
            raise ModelLoadError(
                f"{f} is corrupt or unreadable ({e}). Delete it (for the default model: "
                f"`rm -r {path}`) and run again to rebuild it.") from e
    return state


def read_config(path: Path) -> ModelConfig:
    """config.json as our config: the Llama shapes' ModelConfig, or a family's (families/), the keys
    it leaves out filled as transformers' class for its model_type fills them."""
    from transformers import AutoConfig

    d = json.loads(path.read_text())
    classes = family_classes(d.get("model_type"))
    if classes is None:
        if d.get("model_type") not in CONFIG_FAMILIES:
            raise ModelLoadError(f"model_type {d.get('model_type')!r} is not a family this engine implements; "
                                 f"supported: {', '.join(CONFIG_FAMILIES + tuple(FAMILIES))}")
        return ModelConfig.from_json(path)
    return classes[0].from_hf({**AutoConfig.for_model(**d).to_dict(), **d})


def build_family_model(config: ModelConfig, state: dict[str, torch.Tensor], dtype, device) -> CausalLM:
    """A families/ model: built where it will run (its own buffers, e.g. two RoPE tables, made
    as it builds them), then the HF-named weights loaded; a tied lm_head may be absent."""
    model = family_classes(config.model_type)[1](config)
    result = model.load_state_dict(stack_experts(state), strict=False)  # Qwen3-Next's experts, as saved
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    missing = [k for k in result.missing_keys if k not in tied]
    unexpected = [k for k in result.unexpected_keys if not k.endswith("rotary_emb.inv_freq")]
    if missing or unexpected:
        raise ModelLoadError(f"The checkpoint does not fit this {config.model_type} model: missing "
                             f"{missing[:3]}, unexpected {unexpected[:3]}.")
    return model.to(device=device, dtype=dtype).eval()


def build_model(config: ModelConfig, state: dict[str, torch.Tensor],
                dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> CausalLM:
    """Instantiate our CausalLM and load a HF-named state dict into it."""
    if config.model_type in FAMILIES:
        return build_family_model(config, state, dtype, device)
    with torch.device("meta"):
        model = CausalLM(config)
    if config.tie_word_embeddings:
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}
    state = stack_experts(state)  # MoE: per-expert tensors -> the stacked layout the model holds
    result = model.load_state_dict(state, strict=False, assign=True)
    unexpected = [k for k in result.unexpected_keys if not k.endswith("rotary_emb.inv_freq")]
    if unexpected:
        raise ModelLoadError(f"The checkpoint has weights this architecture does not use, e.g. {unexpected[:3]}.")
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise ModelLoadError(f"The checkpoint lacks {len(missing)} weights, e.g. {missing[:3]}.")
    model.model.rotary_emb = type(model.model.rotary_emb)(config)  # buffers were on meta
    return model.to(device=device, dtype=dtype).eval()


def load_hf_dir(path: Path, dtype=torch.float32, device="cpu") -> LoadedModel:
    from transformers import AutoTokenizer

    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{path} has no config.json: not a Hugging Face model folder.")
    config = read_config(path / "config.json")
    model = build_model(config, read_safetensors_dir(path), dtype, device)
    return LoadedModel(model, AutoTokenizer.from_pretrained(path), path)


def load_model(name_or_path: str | Path | None = None, dtype=torch.float32, device="cpu") -> LoadedModel:
    """Load a model by what `name_or_path` is: None -> the default (SmolLM2-135M-Instruct,
    converted once into a local cache); a folder -> HF layout; a .gguf file -> converted once
    into the cache; anything else -> a hub id (needs internet)."""
    from .default_model import ensure_default_model, ensure_converted_gguf

    if name_or_path is None:
        return load_hf_dir(ensure_default_model(), dtype, device)
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return load_hf_dir(path, dtype, device)
    if path.suffix == ".gguf":
        return load_hf_dir(ensure_converted_gguf(path), dtype, device)
    if path.exists() or str(name_or_path).startswith((".", "/", "~")) or str(name_or_path).count("/") != 1:
        raise ModelLoadError(
            f"No model at {name_or_path!r}: give a folder with config.json and *.safetensors, "
            "a .gguf file, a Hugging Face hub id (owner/name, needs internet), or nothing for the default model.")
    return load_hf_dir(_download_from_hub(str(name_or_path)), dtype, device)


def _download_from_hub(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, allow_patterns=[
            "config.json", "*.safetensors", "tokenizer*", "special_tokens_map.json", "generation_config.json"]))
    except Exception as e:  # no network, unknown repo, gated model...
        raise ModelLoadError(f"Could not download {repo_id!r} from the Hugging Face hub ({e}). "
                             "Without internet, pass a local folder or .gguf file with --model.") from e


def describe(loaded: LoadedModel) -> str:
    c = loaded.config
    n = sum(p.numel() for p in loaded.model.parameters())
    return json.dumps({"path": str(loaded.path), "params": n, "layers": c.num_hidden_layers,
                       "heads": c.num_attention_heads, "kv_heads": c.num_key_value_heads})
