/* Request slots and names from permd.proto's descriptor. */
#include "daemon/reqtype.h"

#include "daemon/metrics.h"
#include "proto/frame.h"

int pd_reqtype_slot(int body_case)
{
    if (body_case >= PD_REQ_FIELD_FIRST && body_case <= PD_REQ_FIELD_LAST &&
        protobuf_c_message_descriptor_get_field(&permd__v1__envelope__descriptor, (unsigned)body_case))
        return body_case - PD_REQ_FIELD_FIRST;
    return PD_REQ_UNKNOWN;
}

const char *pd_reqtype_name(int slot)
{
    switch (slot) {
    case PD_REQ_UNKNOWN:
        return "unknown";
    case PD_REQ_INVALID:
        return "invalid";
    case PD_REQ_CONNECTION:
        return "connection";
    }
    if (slot < 0 || slot >= PD_REQ_UNKNOWN)
        return NULL;
    const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field(
        &permd__v1__envelope__descriptor, (unsigned)(slot + PD_REQ_FIELD_FIRST));
    return f ? f->name : NULL;
}
