"""The compiled paths under the codecs: the C kernels (``native``), the CUDA ones through CuPy
(``cuda``, its arguments ``cuda_args``), the CUDA emulator with its race check and coverage, the
ABI every path shares (``abi``), bit packing, bucket sizes and the counter-based random draws.
The codecs import from here; from the codecs, the kernels read only ``compress.base.Key`` (the
draws' key), except the emulator's coverage run, which drives the codecs themselves."""
