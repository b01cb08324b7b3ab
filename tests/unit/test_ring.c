/* Unit: daemon/ring.c — size, preallocation, the seals that keep a client from faulting permd, free. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_util.h"

#include "core/error.h"
#include "daemon/ring.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

static void test_ring_is_shared_and_sealed(void **state)
{
    (void)state;
    const size_t size = 4 * (size_t)sysconf(_SC_PAGESIZE);
    pd_ring r = PD_RING_NONE;
    assert_int_equal(pd_ring_create(&r, size), 0);
    assert_non_null(r.base);
    assert_true(r.fd >= 0);
    struct stat sb;
    assert_int_equal(fstat(r.fd, &sb), 0);
    assert_int_equal((size_t)sb.st_size, size);
    assert_true((size_t)sb.st_blocks * 512 >= size); /* allocated up front, not on first write */

    /* What permd writes, a read-only mapping of the descriptor (the client's) sees. */
    const uint8_t *view = mmap(NULL, size, PROT_READ, MAP_SHARED, r.fd, 0);
    assert_true(view != MAP_FAILED);
    memset(r.base + size - 100, 0xAB, 100);
    assert_int_equal(view[size - 1], 0xAB);
    assert_int_equal(view[0], 0);

    int seals = fcntl(r.fd, F_GET_SEALS);
    assert_int_equal(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    assert_int_equal(ftruncate(r.fd, 0), -1);
    assert_int_equal(errno, EPERM);
    if (seals & F_SEAL_FUTURE_WRITE) {
        assert_true(mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, r.fd, 0) == MAP_FAILED);
        r.base[0] = 1; /* permd's own mapping stays writable */
        assert_int_equal(view[0], 1);
    }
    munmap((void *)view, size);

    pd_ring_close_fd(&r);
    assert_int_equal(r.fd, -1);
    assert_int_equal(r.base[size - 1], 0xAB); /* the mapping outlives the descriptor */
    pd_ring_free(&r);
    assert_null(r.base);
    pd_ring_free(&r); /* twice is fine */
    pd_ring none = PD_RING_NONE;
    pd_ring_free(&none);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ring_is_shared_and_sealed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
