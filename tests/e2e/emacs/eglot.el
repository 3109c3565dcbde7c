;;; Emacs + eglot end-to-end test of memlsp (run by tests/e2e/emacs.sh), batch mode.
;;; The configuration is the docs/EDITORS.md snippet: eglot-server-programs plus
;;; eglot-workspace-configuration with pathMappings. The workspace has two copies of the JAX
;;; program (jax/ and mapped/); the mapping must send the finding to mapped/.
(require 'eglot)
(require 'flymake)

;; --- the user's configuration (docs/EDITORS.md) ---
(with-eval-after-load 'eglot
  (add-to-list 'eglot-server-programs
               '((python-mode python-ts-mode) . ("memlsp" "lsp"))))
(add-hook 'python-mode-hook #'eglot-ensure)
(setq-default eglot-workspace-configuration
              `(:memlsp (:pathMappings (:/srv/jaxdemo ,(concat (getenv "WS") "/mapped"))
                         :inlayHints (:enable t))))
;; ---

(defvar e2e-passed 0)
(defvar e2e-failed 0)
(defun e2e-check (name ok &optional detail)
  (if ok
      (progn (setq e2e-passed (1+ e2e-passed)) (princ (format "ok     %s\n" name)))
    (setq e2e-failed (1+ e2e-failed))
    (princ (format "FAILED %s%s\n" name (if detail (format ": %S" detail) "")))))

(setq eglot-sync-connect t eglot-connect-timeout 20)
(find-file (concat (getenv "WS") "/mapped/b_mlp_nodonate.py"))
;; Batch mode has no command loop, so eglot-ensure never fires: start eglot the way M-x eglot
;; does, from eglot-server-programs.
(apply #'eglot (eglot--guess-contact))
(e2e-check "eglot connects with (\"memlsp\" \"lsp\") from eglot-server-programs"
           (eglot-current-server) (eglot--guess-contact))
(flymake-mode 1)
(defun e2e-jx005 ()
  (seq-find (lambda (d) (and (= (line-number-at-pos (flymake-diagnostic-beg d)) 57)
                             (string-match-p "JX005" (flymake-diagnostic-text d))))
            (flymake-diagnostics)))
(let ((deadline (+ (float-time) 20)))
  (while (and (< (float-time) deadline) (null (e2e-jx005)))
    (flymake-start)
    (accept-process-output nil 0.2)))
(let ((d (e2e-jx005)))
  (e2e-check "Flymake shows memlsp [JX005] on line 57 of the mapped file (pathMappings applied)"
             (and d (string-match-p "^memlsp \\[JX005\\]: no parameter is donated"
                                    (flymake-diagnostic-text d)))
             (mapcar #'flymake-diagnostic-text (flymake-diagnostics))))
(princ (format "%d passed, %d failed\n" e2e-passed e2e-failed))
(kill-emacs (if (= e2e-failed 0) 0 1))
