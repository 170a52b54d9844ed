/* web_assets.h - the dashboard's files (web/ and the chart library with
 * its licence), compiled into psd by scripts/embed-web.py: the page works
 * offline and nothing is fetched from elsewhere at run time.
 */
#ifndef PS_WEB_ASSETS_H
#define PS_WEB_ASSETS_H

#include <stddef.h>

typedef struct ps_web_asset {
    const char *path;          /* URL path: "/", "/dashboard.js", "/uPlot.LICENSE.txt" */
    const char *type;          /* Content-Type */
    const unsigned char *data;
    size_t len;
} ps_web_asset;

/* The asset served at path, or NULL. */
const ps_web_asset *ps_web_asset_find(const char *path);

#endif
