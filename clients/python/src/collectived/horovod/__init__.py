"""Horovod's API over collectived, for scripts written for Horovod:
``import collectived.horovod.torch as hvd`` in place of ``import
horovod.torch as hvd`` (PyTorch; clients/python/README.md, "Horovod").
This package imports nothing itself; its ``torch`` module imports torch."""
