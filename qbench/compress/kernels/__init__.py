"""The compiled paths under the codecs: the C kernels (``native/``, with the integer view's ends in
``native.units``), the CUDA ones through CuPy (``cuda/``: its arguments ``cuda.args``, the CUDA
emulator ``cuda.emulate`` with its race check ``cuda.racecheck`` and line coverage
``cuda.coverage``), the ABI every path shares (``abi``), bit packing, bucket sizes and the
counter-based random draws.
The codecs import from here; from the codecs, the kernels read only ``compress.base.Key`` (the
draws' key), except the emulator's coverage run, which drives the codecs themselves."""
