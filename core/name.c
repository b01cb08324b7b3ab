/* Name checks shared by the registry, the config file and delivery groups. */
#include "name.h"

#include <string.h>

#include "error.h"

int pd_name_check(const char *name)
{
    size_t len = name ? strlen(name) : 0;
    if (len == 0 || len > PD_NAME_MAX)
        return PD_EINVAL;
    if (name[0] == '.' || name[0] == '-')
        return PD_EINVAL;
    for (size_t i = 0; i < len; i++) {
        char ch = name[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
              ch == '_' || ch == '-'))
            return PD_EINVAL;
    }
    return 0;
}

const char *pd_name_printable(const char *name)
{
    return pd_name_check(name) ? "(invalid name)" : name;
}
