"""Shape checks shared by the registry (before it builds a mechanism) and the mechanisms themselves.

Plain ints only: no tensor is read, so a check never forces a device sync.
"""


def check_length(num_tokens: int, context_length: int, start: int = 0) -> None:
    if start + num_tokens > context_length:
        if start:
            raise ValueError(
                f"{start} cached + {num_tokens} new tokens exceed context_length={context_length}"
            )
        raise ValueError(f"input has T={num_tokens} tokens but context_length={context_length}")


def check_heads(d_model: int, n_head: int) -> None:
    if n_head <= 0 or d_model % n_head != 0:
        raise ValueError(f"d_model={d_model} must be divisible by n_head={n_head}")
