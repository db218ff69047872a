"""A ``config.json`` (a plain mapping, as published) to the ``transformers`` config object and the
model class ``from_pretrained`` would build for it.

The config goes through the config class's own ``from_dict`` -- the same path as
``AutoConfig.from_pretrained`` (``configuration_utils.PreTrainedConfig.from_dict``): its
defaults, its ``attribute_map`` aliases (``n_embd`` is ``hidden_size``) and its nested
sub-configs (``text_config``, ``vision_config``). The model class is the checkpoint's
``architectures[0]`` when this ``transformers`` has it, else the first auto mapping that knows
the config (causal LM, image-text-to-text, seq2seq, speech seq2seq, the bare model).
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Mapping
from typing import Any

import transformers
from transformers import CONFIG_MAPPING, PreTrainedConfig, PreTrainedModel
from transformers.models.auto import modeling_auto

from vrambudget.core.errors import InvalidWorkload

__all__ = ["LIBRARY", "build_config", "model_class"]

LIBRARY = f"transformers {transformers.__version__}"

_AUTO_MAPPINGS = (
    "MODEL_FOR_CAUSAL_LM_MAPPING",
    "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING",
    "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING",
    "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING",
    "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING",
    "MODEL_MAPPING",
)


@contextlib.contextmanager
def _quiet() -> Any:
    """transformers warns on stdout/stderr and through logging about harmless config keys."""
    logger = logging.getLogger("transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logger.setLevel(level)


def build_config(config: Mapping[str, Any], field: str = "config") -> PreTrainedConfig:
    """The config object ``AutoConfig`` would make of this ``config.json``. Errors name
    ``field`` (``model.config``) and say what this ``transformers`` refused."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise InvalidWorkload(
            f"{field}.model_type",
            f"{model_type!r} is not a model type {LIBRARY} knows "
            f"({len(CONFIG_MAPPING)} known, e.g. llama, phi, t5, whisper, mamba)",
        )
    cls = CONFIG_MAPPING[model_type]
    try:
        with _quiet():
            return cls.from_dict(dict(config))
    except Exception as exc:  # noqa: BLE001 - any refusal of the config class is the user's input
        raise InvalidWorkload(field, f"{LIBRARY} refused the config: {_short(exc)}") from None


def model_class(cfg: PreTrainedConfig, config: Mapping[str, Any]) -> type[PreTrainedModel]:
    """The class ``from_pretrained`` builds: ``architectures[0]`` when known, else by the auto
    mappings in order."""
    for name in config.get("architectures") or ():
        cls = getattr(transformers, str(name), None) if isinstance(name, str) else None
        if isinstance(cls, type) and issubclass(cls, PreTrainedModel):
            return cls
    for mapping_name in _AUTO_MAPPINGS:
        mapping = getattr(modeling_auto, mapping_name)
        try:
            found: type[PreTrainedModel] = mapping[type(cfg)]
            return found
        except (KeyError, ValueError):
            continue
    raise InvalidWorkload(
        "config.model_type", f"{LIBRARY} has no model class for {cfg.model_type!r}"
    )


def _short(exc: BaseException, limit: int = 300) -> str:
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."
