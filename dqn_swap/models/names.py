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
