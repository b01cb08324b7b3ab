/* The request table: Envelope body -> handler, with the flags every request is checked against (auth). */
#ifndef PD_DISPATCH_H
#define PD_DISPATCH_H

#include <stdint.h>

#include "daemon/service.h"

/* Decode one frame's payload as an Envelope and run its handler (after the checks its table entry
 * asks for). A frame that is not an Envelope gets PROTOCOL_ERROR and the connection drains. */
void pd_dispatch_frame(pd_session *s, const uint8_t *payload, uint32_t len);

#endif
