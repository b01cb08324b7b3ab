/* Runs a fuzz target's corpus without libFuzzer (gcc, valgrind, CI): every file of the directories or files given, or of the committed corpus. */
#define _DEFAULT_SOURCE /* scandir */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return -1;
    }
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0, n;
    do {
        if (len == cap) {
            cap = cap ? cap * 2 : 65536;
            uint8_t *p = realloc(buf, cap);
            if (!p) {
                free(buf);
                fclose(f);
                return -1;
            }
            buf = p;
        }
        n = fread(buf + len, 1, cap - len, f);
        len += n;
    } while (n);
    fclose(f);
    LLVMFuzzerTestOneInput(buf, len);
    free(buf);
    return 0;
}

static int run_path(const char *path, unsigned *count)
{
    struct stat st;
    if (stat(path, &st)) {
        fprintf(stderr, "replay: %s does not exist\n", path);
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        (*count)++;
        return run_file(path);
    }
    struct dirent **names;
    int n = scandir(path, &names, NULL, alphasort), rc = 0;
    if (n < 0)
        return -1;
    for (int i = 0; i < n; i++) {
        char sub[4096];
        if (names[i]->d_name[0] != '.') {
            snprintf(sub, sizeof sub, "%s/%s", path, names[i]->d_name);
            if (run_path(sub, count))
                rc = -1;
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv)
{
    unsigned count = 0;
    int rc = 0;
    if (argc < 2)
        rc = run_path(PERMD_FUZZ_CORPUS, &count);
    for (int i = 1; i < argc; i++)
        if (run_path(argv[i], &count))
            rc = -1;
    printf("replay: %u inputs, %s\n", count, rc ? "errors" : "no crash");
    return rc || count == 0 ? 1 : 0;
}
