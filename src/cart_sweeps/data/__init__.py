"""Data: recipes tokenized once into uint16 bins (prepare.py), memory-mapped and step-addressed (loader.py)."""
