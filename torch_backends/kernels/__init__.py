"""The torch kernel backends: SDPA, varlen, FlexAttention and the flash-attn packages."""
