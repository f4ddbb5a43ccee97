/*
 * A libcuda.so.1 for a host without a GPU, so that NIXL's LIBFABRIC plugin (which links the
 * CUDA driver library) loads there. The plugin calls these only for VRAM; on DRAM it never does.
 * Every call reports that there is no CUDA device. Built by tests/engine/setup_env.sh.
 */
typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

enum { CUDA_SUCCESS = 0, CUDA_ERROR_NO_DEVICE = 100 };

CUresult cuCtxSetCurrent(CUcontext ctx) {
    (void)ctx;
    return CUDA_ERROR_NO_DEVICE;
}

CUresult cuDeviceGetPCIBusId(char *bus_id, int len, CUdevice dev) {
    (void)bus_id;
    (void)len;
    (void)dev;
    return CUDA_ERROR_NO_DEVICE;
}

CUresult cuPointerGetAttributes(unsigned int count, void *attributes, void **data,
                                CUdeviceptr ptr) {
    (void)count;
    (void)attributes;
    (void)data;
    (void)ptr;
    return CUDA_ERROR_NO_DEVICE;
}

CUresult cuGetErrorString(CUresult error, const char **text) {
    (void)error;
    *text = "no CUDA device (libcuda stand-in)";
    return CUDA_SUCCESS;
}
