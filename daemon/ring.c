/* Stream rings: memfd_create, preallocation, seals, mapping. */
#include "daemon/ring.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/error.h"

#ifndef F_SEAL_FUTURE_WRITE /* Linux 5.1; older C libraries lack the name */
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

int pd_ring_create(pd_ring *r, size_t size)
{
    r->base = NULL;
    r->size = size;
    r->fd = memfd_create("permd-stream-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (r->fd < 0)
        return errno == ENOMEM || errno == EMFILE || errno == ENFILE ? PD_ENOMEM : PD_EIO;
    /* Allocate every page now: a write fault that found no memory later
     * would be a SIGBUS in a worker, not an error. */
    int rc = ftruncate(r->fd, (off_t)size);
    if (rc == 0)
        rc = posix_fallocate(r->fd, 0, (off_t)size) ? -1 : 0;
    void *p = rc ? MAP_FAILED : mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd, 0);
    if (p == MAP_FAILED)
        goto fail;
    r->base = p;
    /* FUTURE_WRITE keeps this mapping writable but refuses the client any
     * writable mapping, write() or hole punching; kernels before 5.1 get
     * the size seals alone (the client can then spoil only its own ids). */
    if (fcntl(r->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) &&
        fcntl(r->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL))
        goto fail;
    return 0;
fail:
    pd_ring_free(r);
    return PD_ENOMEM;
}

void pd_ring_close_fd(pd_ring *r)
{
    if (r->fd >= 0)
        close(r->fd);
    r->fd = -1;
}

void pd_ring_free(pd_ring *r)
{
    if (r->base)
        munmap(r->base, r->size);
    r->base = NULL;
    pd_ring_close_fd(r);
}
