/* Request types: the Envelope body fields a client may send, numbered as metrics slots and named for logs and metrics. */
#ifndef PD_REQTYPE_H
#define PD_REQTYPE_H

/* The metrics slot (daemon/metrics.h) of an Envelope body: its field number's, or PD_REQ_UNKNOWN for
 * no body, a server-only body or a field the protocol does not define. */
int pd_reqtype_slot(int body_case);

/* "fetch", "put_dataset", …, "unknown", "invalid", "connection"; NULL for a request field the
 * protocol does not define. Names come from the protobuf descriptor, so a new request type is
 * named and counted without touching this module. */
const char *pd_reqtype_name(int slot);

#endif
