/* Handlers that describe the server: Hello (protocol version, limits, token authentication) and Stats. */
#ifndef PD_HELLO_H
#define PD_HELLO_H

#include <stdint.h>

#include "daemon/service.h"
#include "proto/frame.h"

void pd_on_hello(pd_session *s, uint64_t id, const Permd__V1__Hello *m);
void pd_on_stats(pd_session *s, uint64_t id, const Permd__V1__Stats *m);

#endif
