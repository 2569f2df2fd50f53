"""Words in messages: a count with its noun in the right number."""


def count(n: int, noun: str) -> str:
    """`1 run`, `2 runs`, `0 runs`."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
