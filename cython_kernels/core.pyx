# edged's compiled core: one module, one thread pool per process. Each concern lives in its
# own .pxi (kernels.pxi: weight kernels and threads; forward.pxi: the forward pass;
# sampling.pxi: the sampler; numa.pxi: NUMA memory placement; encoder.pxi: an encoder's
# per-layer float work).
import numpy as np

include "forward.pxi"
include "sampling.pxi"
include "kernels.pxi"
include "numa.pxi"
include "encoder.pxi"
