/* Names and descriptions of the PD_E* error codes. */
#include "error.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

static const struct {
    int code;
    const char *name;
    const char *text;
} pd_errors[] = {
    {PD_OK, "PD_OK", "success"},
    {PD_EINVAL, "PD_EINVAL", "invalid argument"},
    {PD_ERANGE, "PD_ERANGE", "out of range"},
    {PD_ENOMEM, "PD_ENOMEM", "out of memory"},
    {PD_EOVERFLOW, "PD_EOVERFLOW", "value does not fit the requested width"},
    {PD_EIO, "PD_EIO", "input/output error"},
    {PD_EPROTO, "PD_EPROTO", "protocol error"},
    {PD_ENOTFOUND, "PD_ENOTFOUND", "not found"},
    {PD_ECONFLICT, "PD_ECONFLICT", "conflicts with existing state"},
    {PD_EAUTH, "PD_EAUTH", "not authenticated"},
    {PD_EBUSY, "PD_EBUSY", "server overloaded"},
    {PD_ETOOBIG, "PD_ETOOBIG", "exceeds a limit"},
    {PD_EUNSUPPORTED, "PD_EUNSUPPORTED", "not supported"},
    {PD_ECLOSED, "PD_ECLOSED", "closed"},
    {PD_ETIMEDOUT, "PD_ETIMEDOUT", "timed out"},
    {PD_EINTERNAL, "PD_EINTERNAL", "internal error"},
    {PD_EUNAVAILABLE, "PD_EUNAVAILABLE", "unavailable on this machine"},
    {PD_ECORRUPT, "PD_ECORRUPT", "stored data is damaged"},
};

static size_t pd_error_index(int err)
{
    for (size_t i = 0; i < sizeof pd_errors / sizeof pd_errors[0]; i++)
        if (pd_errors[i].code == err)
            return i;
    return (size_t)-1;
}

const char *pd_strerror(int err)
{
    size_t i = pd_error_index(err);
    return i == (size_t)-1 ? "unknown error" : pd_errors[i].text;
}

const char *pd_errname(int err)
{
    size_t i = pd_error_index(err);
    return i == (size_t)-1 ? "PD_E?" : pd_errors[i].name;
}

void pd_errf(char *err, size_t len, const char *fmt, ...)
{
    if (!err || !len)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
}
