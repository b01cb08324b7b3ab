/* Tests for core/rank.c: epoch lengths per mode, rank slices against the spec's vectors, coverage and resume. */
#include "test_util.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/rank.h"
#include "vectors_v1.h"

static void known_rank_slices(void **state)
{
    (void)state;
    assert_true(VEC_COUNT(vec_ranks) >= 5);
    for (size_t i = 0; i < VEC_COUNT(vec_ranks); i++) {
        const struct vec_ranks *v = &vec_ranks[i];
        pd_perm p;
        pd_slice s = {.world = v->world, .offset = v->offset};
        assert_int_equal(pd_mode_parse(v->mode, &s.mode), PD_OK);
        assert_int_equal(pd_perm_init(&p, v->seed, v->epoch, PD_STREAM_SAMPLES, v->n), PD_OK);
        const uint64_t *want = v->ids;
        for (uint32_t r = 0; r < v->world; r++) {
            uint64_t got[64], n = 0;
            uint32_t got32[64];
            s.rank = r;
            assert_true(v->lens[r] <= 64);
            assert_int_equal(pd_slice_fill_u64(&p, &s, v->lens[r], got, &n), PD_OK);
            assert_int_equal(n, v->lens[r]);
            assert_int_equal(pd_slice_fill_u32(&p, &s, v->lens[r], got32, &n), PD_OK);
            for (size_t j = 0; j < v->lens[r]; j++) {
                assert_true(got[j] == want[j]);
                assert_true(got32[j] == want[j]);
            }
            if (v->offset == 0) { /* whole-epoch cases list everything the rank reads */
                uint64_t left;
                assert_int_equal(pd_slice_remaining(v->n, &s, &left), PD_OK);
                assert_int_equal(left, v->lens[r]);
            }
            want += v->lens[r];
        }
    }
}

static void epoch_lengths(void **state)
{
    (void)state;
    uint64_t t;
    assert_int_equal(pd_epoch_length(10, 3, PD_MODE_PAD, &t), PD_OK);
    assert_int_equal(t, 12);
    assert_int_equal(pd_epoch_length(10, 3, PD_MODE_DROP, &t), PD_OK);
    assert_int_equal(t, 9);
    assert_int_equal(pd_epoch_length(10, 3, PD_MODE_EXACT, &t), PD_OK);
    assert_int_equal(t, 10);
    assert_int_equal(pd_epoch_length(3, 8, PD_MODE_PAD, &t), PD_OK); /* W > n still pads */
    assert_int_equal(t, 8);
    assert_int_equal(pd_epoch_length(3, 8, PD_MODE_DROP, &t), PD_OK);
    assert_int_equal(t, 0);
    assert_int_equal(pd_epoch_length(12, 4, PD_MODE_PAD, &t), PD_OK);
    assert_int_equal(t, 12);
    /* the widest values must not overflow */
    assert_int_equal(pd_epoch_length(UINT64_C(1) << 63, UINT32_MAX, PD_MODE_PAD, &t), PD_OK);
    assert_true(t >= UINT64_C(1) << 63 && t % UINT32_MAX == 0 && t - (UINT64_C(1) << 63) < UINT32_MAX);
}

/* Pad mode wraps like DistributedSampler: indices += indices[:padding], repeated when W > n. */
static void pad_wraps_like_distributed_sampler(void **state)
{
    (void)state;
    const uint64_t n = 5;
    const uint32_t w = 12;
    pd_perm p;
    assert_int_equal(pd_perm_init(&p, 3, 4, 0, n), PD_OK);
    uint64_t base[5], want[12];
    assert_int_equal(pd_perm_fill_u64(&p, 0, n, base), PD_OK);
    for (uint64_t i = 0; i < 12; i++)
        want[i] = base[i % n];
    for (uint32_t r = 0; r < w; r++) {
        pd_slice s = {.world = w, .rank = r, .mode = PD_MODE_PAD};
        uint64_t got[2], cnt;
        assert_int_equal(pd_slice_fill_u64(&p, &s, 2, got, &cnt), PD_OK);
        assert_int_equal(cnt, 1);
        assert_true(got[0] == want[r]);
    }
}

/* Every sample exactly once per epoch in exact mode, at every W; pad/drop give equal counts. */
static void modes_cover_as_specified(void **state)
{
    (void)state;
    uint64_t rng = 3;
    uint32_t *hits = malloc(2000 * sizeof *hits);
    uint64_t *buf = malloc(2000 * sizeof *buf);
    assert_non_null(hits);
    assert_non_null(buf);
    for (int trial = 0; trial < 200; trial++) {
        uint64_t n = 1 + test_below(&rng, 1500);
        uint32_t w = 1 + (uint32_t)test_below(&rng, 40);
        pd_perm p;
        assert_int_equal(pd_perm_init(&p, (uint64_t)trial, 9, 0, n), PD_OK);
        for (int m = PD_MODE_PAD; m <= PD_MODE_EXACT; m++) {
            uint64_t len, total = 0, cnt0 = 0;
            assert_int_equal(pd_epoch_length(n, w, (pd_mode)m, &len), PD_OK);
            memset(hits, 0, n * sizeof *hits);
            for (uint32_t r = 0; r < w; r++) {
                pd_slice s = {.world = w, .rank = r, .mode = (pd_mode)m};
                uint64_t cnt, left;
                assert_int_equal(pd_slice_remaining(n, &s, &left), PD_OK);
                assert_int_equal(pd_slice_fill_u64(&p, &s, 2000, buf, &cnt), PD_OK);
                assert_int_equal(cnt, left);
                if (r == 0)
                    cnt0 = cnt;
                if (m != PD_MODE_EXACT)
                    assert_int_equal(cnt, cnt0); /* pad and drop: every rank reads the same count */
                else
                    assert_true(cnt0 - cnt <= 1);
                for (uint64_t k = 0; k < cnt; k++)
                    hits[buf[k]]++;
                total += cnt;
            }
            assert_int_equal(total, len);
            for (uint64_t sidx = 0; sidx < n; sidx++) {
                if (m == PD_MODE_EXACT)
                    assert_int_equal(hits[sidx], 1);
                else if (m == PD_MODE_DROP)
                    assert_true(hits[sidx] <= 1);
                else
                    assert_true(hits[sidx] >= 1);
            }
        }
    }
    free(hits);
    free(buf);
}

/* Save at offset O under W1, resume under W2: the union is every sample exactly once. */
static void resume_under_another_world(void **state)
{
    (void)state;
    const uint64_t n = 1009;
    uint32_t *hits = calloc(n, sizeof *hits);
    uint64_t *buf = malloc(n * sizeof *buf);
    assert_non_null(hits);
    assert_non_null(buf);
    pd_perm p;
    assert_int_equal(pd_perm_init(&p, 77, 5, 0, n), PD_OK);
    const uint32_t worlds[][2] = {{4, 3}, {4, 8}, {8, 3}, {1, 7}, {7, 1}};
    for (size_t t = 0; t < sizeof worlds / sizeof worlds[0]; t++) {
        uint32_t w1 = worlds[t][0], w2 = worlds[t][1];
        uint64_t steps = 37; /* lockstep steps done before the "crash" */
        uint64_t offset = steps * w1;
        memset(hits, 0, n * sizeof *hits);
        for (uint32_t r = 0; r < w1; r++) {
            pd_slice s = {.world = w1, .rank = r, .mode = PD_MODE_EXACT};
            uint64_t cnt;
            assert_int_equal(pd_slice_fill_u64(&p, &s, steps, buf, &cnt), PD_OK);
            assert_int_equal(cnt, steps);
            for (uint64_t k = 0; k < cnt; k++)
                hits[buf[k]]++;
        }
        for (uint32_t r = 0; r < w2; r++) {
            pd_slice s = {.world = w2, .rank = r, .mode = PD_MODE_EXACT, .offset = offset};
            uint64_t cnt;
            assert_int_equal(pd_slice_fill_u64(&p, &s, n, buf, &cnt), PD_OK);
            for (uint64_t k = 0; k < cnt; k++)
                hits[buf[k]]++;
        }
        for (uint64_t i = 0; i < n; i++)
            assert_int_equal(hits[i], 1);
    }
    free(hits);
    free(buf);
}

static void positions_and_the_end(void **state)
{
    (void)state;
    pd_slice s = {.world = 4, .rank = 3, .mode = PD_MODE_EXACT, .offset = 2};
    uint64_t pos, left;
    assert_int_equal(pd_slice_position(10, &s, 0, &pos), PD_OK);
    assert_int_equal(pos, 5);
    assert_int_equal(pd_slice_position(10, &s, 1, &pos), PD_OK);
    assert_int_equal(pos, 9);
    assert_int_equal(pd_slice_position(10, &s, 2, &pos), PD_ERANGE);
    s.offset = 10; /* at T: empty, not an error */
    assert_int_equal(pd_slice_remaining(10, &s, &left), PD_OK);
    assert_int_equal(left, 0);
    pd_perm p;
    uint64_t buf[4], cnt = 99;
    assert_int_equal(pd_perm_init(&p, 1, 1, 0, 10), PD_OK);
    assert_int_equal(pd_slice_fill_u64(&p, &s, 4, buf, &cnt), PD_OK);
    assert_int_equal(cnt, 0);
    s.offset = 8; /* rank 3 would read 11: past T, empty */
    assert_int_equal(pd_slice_fill_u64(&p, &s, 4, buf, &cnt), PD_OK);
    assert_int_equal(cnt, 0);
    s.offset = 11;
    assert_int_equal(pd_slice_remaining(10, &s, &left), PD_ERANGE);
    assert_int_equal(pd_slice_fill_u64(&p, &s, 4, buf, &cnt), PD_ERANGE);
}

static void modes_by_name(void **state)
{
    (void)state;
    pd_mode m;
    assert_int_equal(pd_mode_parse("pad", &m), PD_OK);
    assert_int_equal(m, PD_MODE_PAD);
    assert_int_equal(pd_mode_parse("exact", &m), PD_OK);
    assert_int_equal(m, PD_MODE_EXACT);
    assert_string_equal(pd_mode_name(PD_MODE_DROP), "drop");
    assert_int_equal(pd_mode_parse("Pad", &m), PD_EINVAL);
    assert_int_equal(pd_mode_parse("", &m), PD_EINVAL);
    assert_int_equal(pd_mode_parse(NULL, &m), PD_EINVAL);
    assert_string_equal(pd_mode_name((pd_mode)9), "?");
    assert_int_equal(pd_id_width(UINT64_C(1) << 32), 4);
    assert_int_equal(pd_id_width((UINT64_C(1) << 32) + 1), 8);
}

static void bad_arguments(void **state)
{
    (void)state;
    uint64_t t, buf[2], cnt;
    uint32_t b32[2];
    pd_perm p;
    pd_slice s = {.world = 2, .rank = 0, .mode = PD_MODE_PAD};
    assert_int_equal(pd_epoch_length(0, 1, PD_MODE_PAD, &t), PD_EINVAL);
    assert_int_equal(pd_epoch_length((UINT64_C(1) << 63) + 1, 1, PD_MODE_PAD, &t), PD_EINVAL);
    assert_int_equal(pd_epoch_length(10, 0, PD_MODE_PAD, &t), PD_EINVAL);
    assert_int_equal(pd_epoch_length(10, 1, (pd_mode)3, &t), PD_EINVAL);
    assert_int_equal(pd_epoch_length(10, 1, PD_MODE_PAD, NULL), PD_EINVAL);
    assert_int_equal(pd_slice_check(10, NULL), PD_EINVAL);
    s.rank = 2;
    assert_int_equal(pd_slice_check(10, &s), PD_EINVAL);
    s.rank = 0;
    s.world = 0;
    assert_int_equal(pd_slice_check(10, &s), PD_EINVAL);
    s.world = 2;
    s.offset = 11;
    assert_int_equal(pd_slice_check(10, &s), PD_ERANGE);
    s.offset = UINT64_MAX;
    assert_int_equal(pd_slice_check(10, &s), PD_ERANGE);
    s.offset = 0;
    assert_int_equal(pd_slice_remaining(10, &s, NULL), PD_EINVAL);
    assert_int_equal(pd_slice_position(10, &s, 0, NULL), PD_EINVAL);
    assert_int_equal(pd_perm_init(&p, 1, 1, 0, 10), PD_OK);
    assert_int_equal(pd_slice_fill_u64(NULL, &s, 1, buf, &cnt), PD_EINVAL);
    assert_int_equal(pd_slice_fill_u64(&p, NULL, 1, buf, &cnt), PD_EINVAL);
    assert_int_equal(pd_slice_fill_u64(&p, &s, 1, NULL, &cnt), PD_EINVAL);
    assert_int_equal(pd_slice_fill_u64(&p, &s, 1, buf, NULL), PD_EINVAL);
    assert_int_equal(pd_perm_init(&p, 1, 1, 0, (UINT64_C(1) << 32) + 1), PD_OK);
    assert_int_equal(pd_slice_fill_u32(&p, &s, 2, b32, &cnt), PD_EOVERFLOW);
    assert_int_equal(pd_slice_fill_u64(&p, &s, 2, buf, &cnt), PD_OK);
    assert_int_equal(cnt, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(known_rank_slices),
        cmocka_unit_test(epoch_lengths),
        cmocka_unit_test(pad_wraps_like_distributed_sampler),
        cmocka_unit_test(modes_cover_as_specified),
        cmocka_unit_test(resume_under_another_world),
        cmocka_unit_test(positions_and_the_end),
        cmocka_unit_test(modes_by_name),
        cmocka_unit_test(bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
