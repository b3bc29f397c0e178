"""The zoo's names, without importing torch (``dqn-swap --help`` lists them at once)."""

MODEL_NAMES: tuple[str, ...] = (
    "resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnet1001", "resnet1517", "resnet_sd",
    "resnet_tiny", "vgg16", "vgg19", "densenet121", "unet", "lstm", "lstm_short", "gpt", "gpt_tiny", "kmeans",
    "mlp_tiny",
)
#: Hugging Face models are named hf:NAME (dqn_swap.models.hf).
HF_NAMES: tuple[str, ...] = ("hf:gpt2", "hf:llama", "hf:bert", "hf:vit")

#: Beyond any batch a device could hold (a guard against typing 10**20).
MAX_BATCH = 2**24


def check_batch_size(value: object) -> int:
    """``value`` as a batch size, or ``ValueError`` saying what a batch size is."""
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_BATCH:
        raise ValueError(f"batch size must be a whole number from 1 to {MAX_BATCH}, not {value!r}")
    return value


def split_model_spec(spec: str) -> tuple[str, int | None]:
    """``MODEL[:BATCH]`` as (model name, batch or None), for every kind of name: ``resnet18:32``,
    ``hf:gpt2:8`` or ``hf:PATH:8``, ``gen:FAMILY:SEED`` (its own batch) or ``gen:FAMILY:SEED:BATCH``.
    A batch that is not a batch size raises ``ValueError`` naming the form."""
    if spec.startswith("gen:"):
        parts = spec.split(":")
        name, batch = (":".join(parts[:3]), parts[3]) if len(parts) == 4 else (spec, "")
    elif spec.startswith("hf:"):
        head, _, tail = spec[3:].rpartition(":")
        name, batch = (f"hf:{head}", tail) if head and tail.isdigit() else (spec, "")
    else:
        name, _, batch = spec.partition(":")
    if not batch:
        return name, None
    try:
        return name, check_batch_size(batch)
    except ValueError:
        raise ValueError(f"{spec}: the batch size after ':' must be a whole number from 1 to {MAX_BATCH}") from None
