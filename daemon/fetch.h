/* Handlers that read a rank's slice: Fetch (ids or locations), Digest (a coverage digest), Inverse (samples to positions). */
#ifndef PD_FETCH_H
#define PD_FETCH_H

#include <stdint.h>

#include "daemon/service.h"
#include "proto/frame.h"

void pd_on_fetch(pd_session *s, uint64_t id, const Permd__V1__Fetch *m);
void pd_on_digest(pd_session *s, uint64_t id, const Permd__V1__Digest *m);
void pd_on_inverse(pd_session *s, uint64_t id, const Permd__V1__Inverse *m);

#endif
