"""The torch-free core: the types every other layer speaks, and every exception.

Nothing here imports torch, numpy, cattrs or matplotlib (a test checks), so
reports can be read, compared and rendered as text where torch is heavy.
"""
