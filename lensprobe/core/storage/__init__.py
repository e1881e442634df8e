"""Where results live and how a run is identified: content identities (:mod:`.identity`), JSON
descriptions and digests (:mod:`.jsonable`), file locks (:mod:`.locks`), the results store (atomic
writes, the settings check, shard files and their one merge rule: :mod:`.store`), append-only row files
(:mod:`.rowfiles`), a command's output folder (:mod:`.outfolder`), sharding work over processes
(:mod:`.shards`) and reading a file lensprobe is given, checked to be a regular file of bounded size
(:mod:`.files`).

May import: :mod:`lensprobe.core.errors`, :mod:`lensprobe.core.lazy` and third-party libraries.
"""
