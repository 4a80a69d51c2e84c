"""Metal reduction for Apple-silicon ranks: off unless proven (MCCL_METAL, see settings.py).

reduce_arith.h  the arithmetic, compiled as MSL at run time and as C++ in the engine's tests
kernels.py      the Metal library (torch.mps.compile_shader) and MetalReducer
gate.py         selection, first-use self-test, agreement of all ranks, log-once fallback
"""
