"""Files on disk: atomic writes and checked reads (:mod:`~probtrans.storage.io`), a folder's
lock, and tensors-only checkpoints loaded without pickle."""
