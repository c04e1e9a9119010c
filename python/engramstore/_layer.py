"""The layer API (compatible with Mooncake's EngramStore): a thin mapping
onto the table API, where layer L head h is the table ``engram:l{L}:h{h}``."""
from __future__ import annotations

import errno as _errno
from collections.abc import Mapping, Sequence

from . import _engram
from . import EngramStore, EngramStoreConfig, StateError, TableExistsError, TableNotFoundError, TableStore


def _error(cls, code: int, msg: str):
    e = cls(msg)
    e.errno = code
    return e


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


class LayerStore(EngramStore):
    """``LayerStore({layer_id: EngramStoreConfig, ...}, store=None)``

    ``store`` is a store client (e.g. :class:`engramstore.LocalStore`): the
    layers' tables are populated into it and read from it.  With
    ``store=None`` the layer store is metadata only, and serves the arrays
    given to :meth:`bind_local`.
    """

    def __init__(self, layers, store=None):
        if not isinstance(layers, Mapping):
            raise TypeError(f"layers: expected a dict of layer_id -> EngramStoreConfig, "
                            f"got {type(layers).__name__}")
        if not layers:
            raise ValueError("layers: at least one layer is needed")
        specs = {}
        for layer_id, cfg in layers.items():
            if not _is_int(layer_id) or layer_id < 0:
                raise ValueError(f"layers: layer id {layer_id!r} is not a nonnegative int")
            if not isinstance(cfg, EngramStoreConfig):
                raise TypeError(f"layers[{layer_id}]: expected an EngramStoreConfig, "
                                f"got {type(cfg).__name__}")
            sizes = cfg.table_vocab_sizes
            if not isinstance(sizes, Sequence) or isinstance(sizes, (str, bytes)) or not sizes:
                raise ValueError(f"layers[{layer_id}].table_vocab_sizes: expected a nonempty "
                                 f"list of table sizes, got {sizes!r}")
            for h, n in enumerate(sizes):
                if not _is_int(n) or n <= 0:
                    raise ValueError(f"layers[{layer_id}].table_vocab_sizes[{h}]: expected a "
                                     f"positive int, got {n!r}")
            if not _is_int(cfg.row_bytes) or cfg.row_bytes <= 0:
                raise ValueError(f"layers[{layer_id}].row_bytes: must be set to a positive int "
                                 f"(got {cfg.row_bytes!r})")
            specs[layer_id] = (tuple(sizes), cfg.row_bytes)

        if store is None:
            self._store = TableStore(local_dir=None)
            self._owned = True
        elif isinstance(store, TableStore) and store.path != "<memory>":
            self._store = store
            self._owned = False
        else:
            raise TypeError(f"store: expected an engramstore store client (e.g. "
                            f"engramstore.LocalStore(local_dir, namespace)) or None, "
                            f"got {store!r}")
        self._specs = specs
        self._keys = {layer_id: tuple(f"engram:l{layer_id}:h{h}" for h in range(len(sizes)))
                      for layer_id, (sizes, _) in specs.items()}
        self._bound = set()
        try:
            for layer_id, (sizes, row_bytes) in specs.items():
                for key, n in zip(self._keys[layer_id], sizes):
                    self._store.define(key, n, row_bytes)
        except BaseException:
            if self._owned:
                self._store.close()
            raise
        self._lookup = self._store._lookup_layer

    # -- helpers ------------------------------------------------------------

    def _layer(self, layer_id):
        try:
            return self._specs[layer_id]
        except (KeyError, TypeError):
            raise ValueError(f"layer_id: {layer_id!r} is not a layer of this store "
                             f"(layers: {sorted(self._specs)})") from None

    def _check_buffers(self, layer_id, buffers, arg):
        sizes, row_bytes = self._layer(layer_id)
        if not isinstance(buffers, (list, tuple)):
            raise TypeError(f"{arg}: expected a list of {len(sizes)} arrays (one per head), "
                            f"got {type(buffers).__name__}")
        if len(buffers) != len(sizes):
            raise ValueError(f"{arg}: layer {layer_id} has {len(sizes)} heads, "
                             f"got {len(buffers)} arrays")
        # Check every head before writing any.
        for h, (buf, n) in enumerate(zip(buffers, sizes)):
            _engram._check_rows(buf, f"{arg}[{h}]", n, row_bytes)

    # -- the Mooncake-compatible API ----------------------------------------

    def populate(self, layer_id: int, embedding_buffers) -> None:
        """Stores one C-contiguous uint8 ``[N_h, row_bytes]`` array per head
        in the store client (create-only, atomic per head).  Every array is
        checked before the first head is written."""
        if self._owned:
            raise _error(StateError, _engram.ESTATE,
                         "populate: this EngramStore has no store (store=None); "
                         "use bind_local, or pass a store client")
        self._check_buffers(layer_id, embedding_buffers, "embedding_buffers")
        for key, buf in zip(self._keys[layer_id], embedding_buffers):
            self._store.populate(key, buf)

    def bind_local(self, layer_id: int, embedding_buffers) -> None:
        """Serves caller arrays (one C-contiguous uint8 ``[N_h, row_bytes]``
        per head, e.g. np.memmap views) as the layer's tables without
        copying; they are referenced until :meth:`close`."""
        if not self._owned:
            raise _error(StateError, _engram.ESTATE,
                         "bind_local: this EngramStore reads a store client; bind_local needs "
                         "store=None")
        self._check_buffers(layer_id, embedding_buffers, "embedding_buffers")
        if layer_id in self._bound:
            raise _error(TableExistsError, _errno.EEXIST, f"layer {layer_id} is already bound")
        for key, buf in zip(self._keys[layer_id], embedding_buffers):
            self._store.bind(key, buf)
        self._bound.add(layer_id)

    def lookup_into(self, layer_id: int, row_ids, output) -> None:
        """Gathers ``output[b, l, h] = table_h[row_ids[b, l, h]]``: row_ids a
        C-contiguous int64 ``[B, L, H]`` array (int64 only, as
        in Mooncake's contract), output a writable
        uint8 ``[B, L, H, row_bytes]`` array.  Id -1 leaves its row as is;
        any other id outside its head's table raises BadIdError and output
        is left untouched."""
        try:
            keys = self._keys[layer_id]
        except (KeyError, TypeError):
            self._layer(layer_id)
            raise
        self._lookup(keys, row_ids, output)

    def remove_from_store(self, layer_id: int, force: bool = False) -> int:
        """Removes the layer's tables from the store client and returns how
        many were removed.  Without ``force``, a layer with a head missing
        from the store raises TableNotFoundError and nothing is removed;
        with ``force``, what exists is removed."""
        if self._owned:
            raise _error(StateError, _engram.ESTATE,
                         "remove_from_store: this EngramStore has no store (store=None); "
                         "bound layers are released by close()")
        self._layer(layer_id)
        keys = self._keys[layer_id]
        present = set(self._store.list_tables())
        missing = [k for k in keys if k not in present]
        if missing and not force:
            raise _error(TableNotFoundError, _errno.ENOENT,
                         f"remove_from_store: layer {layer_id}: {', '.join(missing)} not in the "
                         f"store (force=True removes the rest)")
        removed = 0
        for key in keys:
            if key in present:
                try:
                    self._store.remove(key)
                    removed += 1
                except TableNotFoundError:
                    if not force:
                        raise
        return removed

    def get_layer_ids(self) -> list[int]:
        """The configured layer ids, sorted."""
        return sorted(self._specs)

    def get_table_vocab_sizes(self, layer_id: int) -> list[int]:
        """The row count of each head's table of the layer."""
        return list(self._layer(layer_id)[0])

    def get_store_keys(self, layer_id: int) -> list[str]:
        """The table names of the layer's heads: ``engram:l{layer}:h{head}``."""
        self._layer(layer_id)
        return list(self._keys[layer_id])

    def get_num_heads(self, layer_id: int) -> int:
        """The number of heads (tables) of the layer."""
        return len(self._layer(layer_id)[0])

    def get_row_bytes(self, layer_id: int) -> int:
        """The bytes of one row of the layer's tables."""
        return self._layer(layer_id)[1]

    # -- lifetime -----------------------------------------------------------

    @property
    def store(self):
        """The store client, or None for a metadata-only (bind_local) store."""
        return None if self._owned else self._store

    def stats(self) -> dict:
        """The underlying table store's stats (see TableStore.stats)."""
        return self._store.stats()

    def close(self) -> None:
        """Releases bound arrays (store=None).  A store client is the
        caller's and stays open."""
        if self._owned:
            self._store.close()
        self._lookup = _closed_lookup

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        where = "store=None" if self._owned else f"store={self._store!r}"
        return f"<engramstore.EngramStore layers={self.get_layer_ids()} {where}>"


def _closed_lookup(*args):
    raise _error(_engram.StoreClosedError, _engram.ESTATE, "the store is closed")
