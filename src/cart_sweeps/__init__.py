"""cart_sweeps: the two-stage CART looped-transformer study, end to end."""

__version__ = "0.1.0"
