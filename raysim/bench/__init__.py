"""``raysim bench``: raysim against a plain PyTorch loop, population sizes, start-up seconds."""
