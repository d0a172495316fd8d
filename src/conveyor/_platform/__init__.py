"""Every process-wide side effect conveyor has, one module per kind.

Nothing here runs at ``import conveyor`` but ``process``'s ``atexit`` hook and the fork
hooks the modules that use ``process.on_fork_child`` register at their import.

==================  =============================================================  ==================
module              side effect                                                    where it applies
==================  =============================================================  ==================
``torch_hooks``     torch's ``get_worker_info.__code__`` rewritten to call a        processes with
                    router (or the module attribute replaced); torch's              thread workers;
                    ``_worker_info`` set; an import hook for ``torch.utils.data``;  process workers
                    torch's ``default_collate_fn_map[Tensor]`` replaced
``imports``         import hooks put first on ``sys.meta_path`` (``insert_first``:  any process
                    numpy's RNG seeded on import (``rng``), ``torch_hooks``,
                    torch set up and seeded when a torch-free spawned worker
                    first imports it (``executors.torchless``))
``rng_memory``      the global RNGs' C structs read in place with ``ctypes``        any process
``gc_freeze``       ``gc.freeze()`` while fork workers run; a ``gc.callbacks``      main process
                    entry that unfreezes around full collections
``signals``         SIGINT's handler swapped while bookkeeping (``hold_ctrl_c``);  main process
                    SIGPIPE blocked around pipe writes (``no_sigpipe``);
                    SIGINT ignored, SIGTERM/SIGHUP cleanup handlers, SIGUSR1        worker processes
                    stack dumps (``faulthandler``)
``malloc``          glibc's ``mallopt`` thresholds fixed (ctypes);                  worker processes;
                    a malloc and free of a kept buffer's size (``as_if_freed``)    main process
``process``         ``os.register_at_fork`` hooks; an ``atexit`` hook; a spawned    any process;
                    worker's ``os._exit``; ``os.nice``                              worker processes
==================  =============================================================  ==================

Elsewhere, named here so that the list is whole: the global RNGs seeded, saved and
restored (``rng``, ``executors.seeding``), and a worker process's
``torch.set_num_threads(1)`` (``executors.serve``).
"""
