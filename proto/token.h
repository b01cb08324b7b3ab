/* A token file as permd (token_file) and its clients (permctl --token-file) read it: one set of rules for both. */
#ifndef PD_TOKEN_H
#define PD_TOKEN_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PD_TOKEN_MAX 1024 /* the longest token, in bytes: its Hello stays far below max_preauth_frame (4096) */

/* Which rule a token file broke. */
typedef enum pd_token_fault {
    PD_TOKEN_FINE,
    PD_TOKEN_CANNOT_OPEN, /* open or fstat failed (err) */
    PD_TOKEN_CANNOT_READ, /* read failed (err) */
    PD_TOKEN_NOT_REGULAR, /* a directory, a pipe, a FIFO or a device */
    PD_TOKEN_TOO_LONG,    /* the first line is longer than PD_TOKEN_MAX */
    PD_TOKEN_NOT_TEXT,    /* the first line holds a control byte (bad_byte, at bad_at): NUL, tab, DEL, ... */
    PD_TOKEN_EMPTY,       /* the first line is empty */
} pd_token_fault;

typedef struct pd_token_file {
    char token[PD_TOKEN_MAX + 1]; /* the first line without its \n or \r\n, NUL-terminated */
    size_t len;
    unsigned mode;        /* the file's permission bits (permd warns when its group or others may read it) */
    pd_token_fault fault; /* PD_TOKEN_FINE when pd_token_read returned 0 */
    int err;              /* errno, for PD_TOKEN_CANNOT_OPEN and PD_TOKEN_CANNOT_READ */
    size_t bad_at;        /* PD_TOKEN_NOT_TEXT: where the control byte is */
    unsigned bad_byte;    /*   and which it is */
} pd_token_file;

/* Read the token of the file at path into *out: its first line, without its \n or \r\n. The file is opened
 * O_NONBLOCK and must be a regular file, so that a FIFO or a device is refused instead of blocking the
 * reader (permd's startup or event loop, or permctl) until a writer comes. A first line longer than
 * PD_TOKEN_MAX is refused, not cut (clients would send it whole in a Hello that max_preauth_frame refuses);
 * so is a control byte in it (below 0x20, or 0x7f: a token is text; a binary one, head -c 32 /dev/urandom,
 * would be cut at its first \n or \r unseen, and C strings end at its first NUL) and an empty one. Returns 0, or PD_EIO (cannot open or read), PD_ETOOBIG (too long) or PD_EINVAL (any
 * other rule), with out->fault saying which; the caller words the message. */
int pd_token_read(const char *path, pd_token_file *out);

#ifdef __cplusplus
}
#endif

#endif
