/* The scenario file of a fake C library (tests/fake_nvml, tests/fake_cuda): one `key value`
 * per line, blank lines and `#` comments skipped, the last value of a key winning. The
 * including file defines MAX_ENTRIES and includes <stdio.h>, <stdlib.h> and <string.h> first. */

static char *keys[MAX_ENTRIES], *values[MAX_ENTRIES];
static int entries;

/* Keep the entries of `f`, each line read into `line` (`size` bytes), after those kept. */
static void read_entries(FILE *f, char *line, int size) {
    while (entries < MAX_ENTRIES && fgets(line, size, f)) {
        line[strcspn(line, "\r\n")] = 0;
        char *key = line;
        while (*key == ' ' || *key == '\t') key++;
        if (!*key || *key == '#') continue;
        char *value = strchr(key, ' ');
        if (value) {
            *value++ = 0;
            while (*value == ' ') value++;
        }
        keys[entries] = strdup(key);
        values[entries] = strdup(value ? value : "");
        entries++;
    }
}

/* The value kept last for `key`, or NULL. */
static const char *lookup(const char *key) {
    for (int i = entries - 1; i >= 0; i--)
        if (!strcmp(keys[i], key)) return values[i];
    return NULL;
}
