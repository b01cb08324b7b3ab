/* Tests for daemon/metrics.c, reqtype.c and stats.c: request slots, the latency histogram, the Prometheus text and the StatsReply tables. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "daemon/metrics.h"
#include "daemon/reqtype.h"
#include "daemon/stats.h"

static void test_slots(void **state)
{
    (void)state;
    assert_string_equal(pd_reqtype_name(pd_reqtype_slot(PERMD__V1__ENVELOPE__BODY_FETCH)), "fetch");
    assert_string_equal(pd_reqtype_name(pd_reqtype_slot(PERMD__V1__ENVELOPE__BODY_PUT_DATASET)), "put_dataset");
    assert_string_equal(pd_reqtype_name(pd_reqtype_slot(PERMD__V1__ENVELOPE__BODY_STATS)), "stats");
    /* No body, a server-only body and an undefined field are all "unknown". */
    assert_int_equal(pd_reqtype_slot(PERMD__V1__ENVELOPE__BODY__NOT_SET), PD_REQ_UNKNOWN);
    assert_int_equal(pd_reqtype_slot(PERMD__V1__ENVELOPE__BODY_FETCH_REPLY), PD_REQ_UNKNOWN);
    assert_int_equal(pd_reqtype_slot(29), PD_REQ_UNKNOWN);
    assert_null(pd_reqtype_name(29 - PD_REQ_FIELD_FIRST));
    assert_string_equal(pd_reqtype_name(PD_REQ_INVALID), "invalid");
    assert_string_equal(pd_reqtype_name(PD_REQ_CONNECTION), "connection");
}

static void test_histogram(void **state)
{
    (void)state;
    pd_metrics m;
    memset(&m, 0, sizeof m);
    int f = pd_reqtype_slot(PERMD__V1__ENVELOPE__BODY_FETCH);
    pd_metrics_latency(&m, f, 10000);       /* 10 us: the first bucket (le 1e-05) */
    pd_metrics_latency(&m, f, 10001);       /* just above: the second */
    pd_metrics_latency(&m, f, 3000000);     /* 3 ms: le 0.005 */
    pd_metrics_latency(&m, f, 20000000000); /* 20 s: +Inf */
    assert_int_equal(m.latency[f][0], 1);
    assert_int_equal(m.latency[f][1], 1);
    assert_int_equal(m.latency[f][8], 1);
    assert_int_equal(pd_latency_bounds_us[8], 5000);
    assert_int_equal(m.latency[f][PD_LATENCY_NBOUNDS], 1);
    assert_int_equal(m.latency_sum_ns[f], 10000 + 10001 + 3000000 + UINT64_C(20000000000));
    pd_metrics_error(&m, f, PERMD__V1__ERROR_CODE__ERROR_CODE_NOT_FOUND);
    pd_metrics_error(&m, f, (Permd__V1__ErrorCode)99); /* out of range: the last slot, not out of bounds */
    assert_int_equal(m.errors[f][5], 1);
    assert_int_equal(m.errors[f][PD_METRICS_CODES - 1], 1);
}

static void test_render_and_stats(void **state)
{
    (void)state;
    pd_stats_view s;
    memset(&s, 0, sizeof s);
    int f = pd_reqtype_slot(PERMD__V1__ENVELOPE__BODY_FETCH);
    pd_metrics_request(&s.metrics, f);
    pd_metrics_request(&s.metrics, f);
    pd_metrics_latency(&s.metrics, f, 40000);
    pd_metrics_latency(&s.metrics, f, 2000000);
    pd_metrics_error(&s.metrics, f, PERMD__V1__ERROR_CODE__ERROR_CODE_NOT_FOUND);
    pd_metrics_request(&s.metrics, PD_REQ_INVALID);
    s.metrics.rejected[PD_REJECT_PEER_UID] = 3;
    s.stats.ids_served_total = 77;
    s.registry_checkpoint_failures = 4;
    s.http_expired = 6;
    s.http_cache_hits = 8;
    s.log_suppressed[0] = (pd_log_suppressed){"auth_fail", 20};
    s.nlog_suppressed = 1;
    char *text;
    size_t len;
    assert_int_equal(pd_stats_render(&s, &text, &len), 0);
    assert_int_equal(strlen(text), len);
    const char *want[] = {
        "permd_requests_total{type=\"fetch\"} 2\n",
        "permd_requests_total{type=\"invalid\"} 1\n",
        "permd_request_errors_total{type=\"fetch\",code=\"NOT_FOUND\"} 1\n",
        "permd_request_duration_seconds_bucket{type=\"fetch\",le=\"2.5e-05\"} 0\n",
        "permd_request_duration_seconds_bucket{type=\"fetch\",le=\"5e-05\"} 1\n",
        "permd_request_duration_seconds_bucket{type=\"fetch\",le=\"0.0025\"} 2\n",
        "permd_request_duration_seconds_bucket{type=\"fetch\",le=\"+Inf\"} 2\n",
        "permd_request_duration_seconds_sum{type=\"fetch\"} 0.002040000\n",
        "permd_request_duration_seconds_count{type=\"fetch\"} 2\n",
        "permd_connections_rejected_total{reason=\"peer_uid\"} 3\n",
        "permd_ids_served_total 77\n",
        "permd_registry_checkpoint_failures_total 4\n",
        "permd_http_expired_total 6\n",
        "permd_http_cache_hits_total 8\n",
        "# TYPE permd_log_suppressed_total counter\n",
        "permd_log_suppressed_total{event=\"auth_fail\"} 20\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(text, want[i]))
            fail_msg("missing: %s", want[i]);
    assert_null(strstr(text, "type=\"connection\"")); /* nothing happened there: no series */
    free(text);

    pd_arena arena;
    assert_int_equal(pd_arena_init(&arena, 4096), 0);
    Permd__V1__StatsReply r = PERMD__V1__STATS_REPLY__INIT;
    assert_int_equal(pd_stats_fill_reply(&s, &r, &arena), 0);
    assert_int_equal(r.connections_rejected_total, 3);
    assert_int_equal(r.n_latency_bounds_us, PD_LATENCY_NBOUNDS);
    assert_int_equal(r.n_errors, 1);
    assert_string_equal(r.errors[0]->type, "fetch");
    int seen = 0;
    for (size_t i = 0; i < r.n_requests; i++) {
        if (strcmp(r.requests[i]->type, "fetch"))
            continue;
        seen = 1;
        assert_int_equal(r.requests[i]->requests, 2);
        assert_int_equal(r.requests[i]->errors, 1);
        assert_int_equal(r.requests[i]->latency_sum_us, 2040);
        assert_int_equal(r.requests[i]->n_latency_buckets, PD_LATENCY_NBOUNDS + 1);
        assert_int_equal(r.requests[i]->latency_buckets[2], 1);
    }
    assert_true(seen);
    /* It packs: a real reply. */
    size_t n = permd__v1__stats_reply__get_packed_size(&r);
    uint8_t *buf = malloc(n);
    assert_int_equal(permd__v1__stats_reply__pack(&r, buf), n);
    Permd__V1__StatsReply *back = permd__v1__stats_reply__unpack(NULL, n, buf);
    assert_non_null(back);
    assert_int_equal(back->n_requests, r.n_requests);
    permd__v1__stats_reply__free_unpacked(back, NULL);
    free(buf);
    pd_arena_free(&arena);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slots),
        cmocka_unit_test(test_histogram),
        cmocka_unit_test(test_render_and_stats),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
