
€€€€€€€€@abcdef