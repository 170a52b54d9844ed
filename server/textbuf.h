/* textbuf.h - a growing text buffer for what psd renders on its HTTP port
 * (the dashboard's JSON): printf-style appends, JSON strings and numbers.
 *
 * A ps_textbuf is a plain struct the caller owns; start it zeroed
 * ({0}) and take its text with ps_textbuf_take. Out of memory is sticky:
 * every later append is a no-op and ps_textbuf_take returns NULL, so
 * renderers check once at the end.
 */
#ifndef PS_TEXTBUF_H
#define PS_TEXTBUF_H

#include <stddef.h>

typedef struct ps_textbuf {
    char *p;      /* NUL-terminated while not oom */
    size_t len, cap;
    int oom;
} ps_textbuf;

void ps_textbuf_printf(ps_textbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* s as a JSON string, quotes included (control characters escaped, bytes
 * >= 0x80 passed through: the caller's strings are UTF-8 or ASCII). */
void ps_textbuf_json_str(ps_textbuf *b, const char *s);
/* v as a JSON number; null when it is NaN or infinite (JSON has neither). */
void ps_textbuf_json_num(ps_textbuf *b, double v);
/* The text (caller frees) and its length; NULL after out of memory. The
 * buffer is empty afterwards. */
char *ps_textbuf_take(ps_textbuf *b, size_t *len);

#endif
