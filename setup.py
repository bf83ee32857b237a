"""Build configuration beyond pyproject.toml: the optional C extensions.

``optional=True``: where no C compiler is available the build goes on without them and
gpuviz runs as pure Python: the Python recorder (same rows, more overhead per event) and
the Python BFC allocator (same decisions, several times slower) instead of the native core.
"""

from glob import glob

from setuptools import Extension, setup

# what the log's extensions include: its headers and the vendored xxHash (its LICENSE goes into the sdist with it)
LOG_DEPENDS = sorted(glob("gpuviz/log/*.h") + glob("gpuviz/log/vendor/*/*"))
WHATIF_PARTS = ("sets", "heap", "policies")  # included by gpuviz/scenarios/_whatifcore.c

setup(
    ext_modules=[
        Extension(
            "gpuviz.capture._rowwriter",
            sources=["gpuviz/capture/_rowwriter.c"],
            depends=[
                "gpuviz/log/_rows.h",
                "gpuviz/capture/_clock.h",
                "gpuviz/log/_rowsink.h",
                "gpuviz/log/_window.h",
            ],
            optional=True,
        ),
        Extension(
            "gpuviz.log._staging",
            sources=["gpuviz/log/_staging.c"],
            depends=LOG_DEPENDS,
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(  # the batches of a log recording to a file, written off the recording thread
            "gpuviz.log._batchwriter",
            sources=["gpuviz/log/_batchwriter.c"],
            depends=LOG_DEPENDS,
            extra_compile_args=["-O2"],
            libraries=["pthread"],
            optional=True,
        ),
        Extension(
            "gpuviz.capture._bfcnative",
            sources=["gpuviz/capture/_bfcnative.c", "gpuviz/capture/_bfc_core.c"],
            depends=[
                "gpuviz/capture/_bfc_core.h",
                "gpuviz/log/_rows.h",
                "gpuviz/capture/_clock.h",
                "gpuviz/log/_rowsink.h",
                "gpuviz/log/_window.h",
            ],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(  # the core with gpuviz_malloc/gpuviz_free, for PyTorch's pluggable allocator (POSIX)
            "gpuviz.capture._pluggable",
            sources=["gpuviz/capture/_pluggable.c", "gpuviz/capture/_bfc_core.c"],
            depends=["gpuviz/capture/_bfc_core.h", "gpuviz/log/_window.h", "gpuviz/log/_rows.h"],
            extra_compile_args=["-O2"],
            libraries=["dl", "pthread"],
            optional=True,
        ),
        Extension(  # the streaming reader of PyTorch snapshot pickles (gpuviz.importers.snapshot_reader)
            "gpuviz.importers._snapshotpickle",
            sources=["gpuviz/importers/_snapshotpickle.c"],
            depends=["gpuviz/importers/_columns.h"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(  # the decoder of XPlane memory events (gpuviz.importers.xplane)
            "gpuviz.importers._xplanewire",
            sources=["gpuviz/importers/_xplanewire.c"],
            depends=["gpuviz/importers/_columns.h"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(  # HeapBuilder's heap (gpuviz.log.heapbuilder.NativeHeapBuilder)
            "gpuviz.log._heapcore",
            sources=["gpuviz/log/_heapcore.c"],
            depends=LOG_DEPENDS,
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(  # what-if replays under every policy (gpuviz.scenarios.native)
            "gpuviz.scenarios._whatifcore",
            sources=["gpuviz/scenarios/_whatifcore.c", "gpuviz/capture/_bfc_core.c"],
            depends=["gpuviz/capture/_bfc_core.h", "gpuviz/log/_rows.h", "gpuviz/log/_window.h"]
            + [f"gpuviz/scenarios/_whatif_{part}.h" for part in WHATIF_PARTS],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(  # LiveFollower.update's pass over the new rows (gpuviz.analysis.live)
            "gpuviz.analysis._livekernel",
            sources=["gpuviz/analysis/_livekernel.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "gpuviz.analysis._replaykernel",
            sources=["gpuviz/analysis/_replaykernel.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
    ]
)
