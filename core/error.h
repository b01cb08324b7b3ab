/* Error codes shared by every permd module: 0 is success, failures are negative PD_E* values. */
#ifndef PD_ERROR_H
#define PD_ERROR_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Numbering is part of the C ABI (libpermd, the Python package): append only. */
enum pd_error {
    PD_OK = 0,
    PD_EINVAL = -1,        /* an argument is out of its domain */
    PD_ERANGE = -2,        /* a position, offset or count lies past the end */
    PD_ENOMEM = -3,        /* an allocation failed */
    PD_EOVERFLOW = -4,     /* a result does not fit the requested width (u32 ids for n > 2^32) */
    PD_EIO = -5,           /* a read, write or socket operation failed */
    PD_EPROTO = -6,        /* the peer sent something the protocol does not allow */
    PD_ENOTFOUND = -7,     /* no such dataset or object */
    PD_ECONFLICT = -8,     /* the request contradicts existing state */
    PD_EAUTH = -9,         /* authentication failed or missing */
    PD_EBUSY = -10,        /* the server is overloaded; retry later */
    PD_ETOOBIG = -11,      /* a frame or request exceeds a configured limit */
    PD_EUNSUPPORTED = -12, /* the feature or message is not available here */
    PD_ECLOSED = -13,      /* the connection or stream is closed */
    PD_ETIMEDOUT = -14,    /* an operation did not complete in time */
    PD_EINTERNAL = -15,    /* a bug or an unexpected failure inside permd */
    PD_EUNAVAILABLE = -16, /* the feature needs something this machine lacks (a GPU, NCCL) */
    PD_ECORRUPT = -17,     /* stored data exists but cannot be read whole (a damaged file) */
};

/* A short, static, human-readable description of a PD_E* code. */
const char *pd_strerror(int err);

/* The symbolic name ("PD_EINVAL") of a code, for logs and typed errors. */
const char *pd_errname(int err);

/* printf into a caller's message buffer (err may be NULL or len 0: then nothing is written), for
 * functions that return a PD_E* code and say why in words. */
void pd_errf(char *err, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#ifdef __cplusplus
}
#endif

#endif
